"""The results store: SQLite, schema versioned with ``PRAGMA user_version``.

A *run* is one ``kvmtune bench`` invocation with its environment (kernel,
QEMU, fio versions, accelerator, CPU, host I/O scheduler, arguments). A
*cell* is one configuration × workload × repetition; its numbers are rows in
``metrics`` (name, value) and, for host time series, ``samples``. Raw fio
JSON is kept so statistics can be re-derived later.

Concurrency and damage: the database runs in WAL mode with a busy timeout, so a
reader and a writer (or two writers, one waiting) never fail with "database is
locked"; the schema and its ``user_version`` are created in one ``BEGIN
IMMEDIATE`` transaction, so two first benchmarks on a new database cannot see a
half-made one. A run records its owner (pid, process start time, boot id);
a ``running`` run whose owner is gone reads back as ``abandoned``. SQLite errors
(damaged pages included) become one line naming the file; benchmarks run
:meth:`Store.check` (``PRAGMA quick_check``) before measuring anything.

A results database is untrusted input (``--db``, or a file others can write): before anything is
read or written its schema must be one kvmtune made (the tables and index of schema 1, 2 or 3, the
fleet tables of :mod:`kvmtune.fleet.history` beside them, no views, triggers or virtual tables),
else it is "not a kvmtune results database" and is left as it was (no migration, no journal-mode
change). SQLite runs with ``trusted_schema`` off, a cap on any one value (:data:`MAX_VALUE_BYTES`)
and a progress handler that stops a statement after :data:`QUERY_TIME_LIMIT_S`; every value read
back is type-checked and JSON columns depth-checked, so a hostile file costs one line, not a
traceback, a hang or gigabytes.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from kvmtune.errors import KvmtuneError
from kvmtune.host.process import read_pid_stat
from kvmtune.host.root import HostRoot

SCHEMA_VERSION = 3
BUSY_TIMEOUT_S = 30.0
MAX_VALUE_BYTES = 32 << 20  # SQLITE_LIMIT_LENGTH: a cell's raw fio JSON is kilobytes; no value of a real database nears it
MAX_JSON_CHARS = 1 << 20  # env, args, a cell's configuration: a few KiB in a real database
MAX_JSON_DEPTH = 32
QUERY_TIME_LIMIT_S = 60.0  # one statement; a real database answers in well under a second
PROGRESS_STEPS = 10_000  # SQLite VM steps between looks at the clock

SCHEMA = """
CREATE TABLE runs (
    id INTEGER PRIMARY KEY,
    started REAL NOT NULL,
    finished REAL,
    kind TEXT NOT NULL,
    preset TEXT,
    status TEXT NOT NULL,
    accel TEXT,
    env TEXT NOT NULL,
    args TEXT NOT NULL,
    note TEXT,
    owner_pid INTEGER,
    owner_start TEXT,
    owner_boot TEXT
);
CREATE TABLE cells (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    key TEXT NOT NULL,
    config TEXT NOT NULL,
    workload TEXT NOT NULL,
    rep INTEGER NOT NULL DEFAULT 0,
    status TEXT NOT NULL,
    error TEXT,
    accel TEXT,
    started REAL,
    duration_s REAL,
    raw TEXT,
    attempts INTEGER NOT NULL DEFAULT 1,
    first_error TEXT
);
CREATE INDEX cells_run ON cells(run_id, key);
CREATE TABLE metrics (
    cell_id INTEGER NOT NULL REFERENCES cells(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    value REAL NOT NULL,
    PRIMARY KEY (cell_id, name)
);
CREATE TABLE samples (
    cell_id INTEGER NOT NULL REFERENCES cells(id) ON DELETE CASCADE,
    t REAL NOT NULL,
    name TEXT NOT NULL,
    value REAL NOT NULL
);
"""


# schema N-1 → N; each list runs inside the same transaction as the user_version bump
MIGRATIONS: dict[int, list[str]] = {
    1: [
        "ALTER TABLE runs ADD COLUMN owner_pid INTEGER",
        "ALTER TABLE runs ADD COLUMN owner_start TEXT",
        "ALTER TABLE runs ADD COLUMN owner_boot TEXT",
    ],
    2: [  # a cell measured a second time after its first try failed (issue 50): how many tries, the first's error
        "ALTER TABLE cells ADD COLUMN attempts INTEGER NOT NULL DEFAULT 1",
        "ALTER TABLE cells ADD COLUMN first_error TEXT",
    ],
}
# the columns each migration above adds at the end of a table: schema N's table is the current one less those
# added by the migrations from N on
ADDED_COLUMNS: dict[str, dict[int, int]] = {"runs": {1: 3}, "cells": {2: 2}}


def _dropped(table: str, version: int) -> int:
    """How many of ``table``'s last columns schema ``version`` did not have yet."""
    return sum(n for step, n in ADDED_COLUMNS.get(table, {}).items() if step >= version)


# the stored JSON keys whose type kvmtune's readers rely on (null allowed): anything else may hold any JSON
ENV_TYPES: dict[str, tuple[type, ...]] = {
    k: (str,) for k in ("tier", "netload", "qemu", "fio", "accel", "cpu_model", "host_kernel", "kvmtune")
} | {"topologies": (list,), "ncpu": (int,)}
CONFIG_TYPES: dict[str, tuple[type, ...]] = {
    k: (str,) for k in ("tier", "topology", "rule", "target", "change", "verdict", "action", "metric", "unit", "seed",
                        "bus", "sched", "host_fs", "ovs_datapath")
} | {k: (int,) for k in ("mtu", "hosts", "pairs", "pair")} | {"tunings": (dict,)}


class _Connection(sqlite3.Connection):
    """A connection whose every statement gets :data:`QUERY_TIME_LIMIT_S` from its start (the progress
    handler set in :class:`Store` looks at ``deadline``), so a runaway query ends as an error."""

    deadline = 0.0

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        self.deadline = time.monotonic() + QUERY_TIME_LIMIT_S
        return super().execute(sql, parameters)

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
        self.deadline = time.monotonic() + QUERY_TIME_LIMIT_S
        return super().executemany(sql, parameters)

    def past_deadline(self) -> int:
        return int(time.monotonic() > self.deadline)


@dataclass(frozen=True)
class Owner:
    """The process that runs a benchmark: pid, its start time (clock ticks since boot) and the boot id."""

    pid: int
    start: str
    boot: str

    @classmethod
    def this_process(cls, host: HostRoot | None = None) -> Owner:
        import os

        host = host or HostRoot()
        st = read_pid_stat(host, "self")
        return cls(os.getpid(), str(st.starttime) if st else "", boot_id(host))

    def alive(self, host: HostRoot | None = None) -> bool:
        """False when the owner is provably gone: other boot, no such pid, or a different process on it."""
        host = host or HostRoot()
        if self.boot and boot_id(host) and self.boot != boot_id(host):
            return False
        st = read_pid_stat(host, self.pid)
        if st is None or st.state in ("Z", "X"):
            return False
        return not self.start or str(st.starttime) == self.start


def boot_id(host: HostRoot) -> str:
    return (host.read_optional("/proc/sys/kernel/random/boot_id") or "").strip()


_P = ParamSpec("_P")
_T = TypeVar("_T")


def _one_line(method: Callable[Concatenate[Store, _P], _T]) -> Callable[Concatenate[Store, _P], _T]:
    """SQLite errors (locked past the timeout, damaged pages, full disk) as one line naming the file."""

    @functools.wraps(method)
    def wrapper(self: Store, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return method(self, *args, **kwargs)
        except sqlite3.Error as exc:
            raise KvmtuneError(f"{self.path}: results database error: {exc}{_hint(exc)}") from None

    return wrapper


def _hint(exc: sqlite3.Error) -> str:
    text = str(exc)
    if "malformed" in text or "not a database" in text:
        return " (the file is damaged; keep a copy and use another --db)"
    if "locked" in text or "busy" in text:
        return f" (another kvmtune held it for over {BUSY_TIMEOUT_S:.0f} s)"
    if "interrupted" in text:
        return f" (a query ran for over {QUERY_TIME_LIMIT_S:.0f} s: a hostile or damaged database?)"
    if "too big" in text:
        return f" (a value larger than {MAX_VALUE_BYTES >> 20} MiB: not one kvmtune wrote)"
    return ""


# the fleet report's history (kvmtune.fleet.history), beside the benchmark tables in the same file
FLEET_SCHEMA = """
CREATE TABLE IF NOT EXISTS fleet_collections (id INTEGER PRIMARY KEY, created REAL NOT NULL, label TEXT NOT NULL,
    scope TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS fleet_hosts (collection INTEGER NOT NULL REFERENCES fleet_collections(id),
    host TEXT NOT NULL, status TEXT NOT NULL, problem TEXT NOT NULL, claimed INTEGER NOT NULL DEFAULT 0,
    scope TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (collection, host));
CREATE TABLE IF NOT EXISTS fleet_findings (collection INTEGER NOT NULL REFERENCES fleet_collections(id),
    host TEXT NOT NULL, rule TEXT NOT NULL, severity TEXT NOT NULL, topic TEXT NOT NULL, domain TEXT NOT NULL,
    device TEXT NOT NULL, summary TEXT NOT NULL, uuid TEXT NOT NULL DEFAULT '', waiver TEXT NOT NULL DEFAULT '');
"""
# Columns added after a fleet table was first made, oldest first: ensure_fleet_tables adds the missing ones at
# the end, in this order, and _validate accepts each earlier shape (the table's columns up to any of them).
# claimed: a host's name is its document's own claim; scope: what the collection (a host) was asked to audit
# (host, guests, both); uuid and waiver: a finding's guest UUID and the reason a waiver accepted it.
FLEET_ADDED: dict[str, tuple[tuple[str, str], ...]] = {
    "fleet_collections": (("scope", "TEXT NOT NULL DEFAULT ''"),),
    "fleet_hosts": (("claimed", "INTEGER NOT NULL DEFAULT 0"), ("scope", "TEXT NOT NULL DEFAULT ''")),
    "fleet_findings": (("uuid", "TEXT NOT NULL DEFAULT ''"), ("waiver", "TEXT NOT NULL DEFAULT ''")),
}


def _reference() -> dict[str, tuple[Any, ...]]:
    """The shape of every object kvmtune creates (the current schema and the fleet tables), from an in-memory copy."""
    con = sqlite3.connect(":memory:")
    try:
        con.executescript(SCHEMA + FLEET_SCHEMA)
        names = [r[0] for r in con.execute("SELECT name FROM sqlite_master")]
        return {name: _shape(con, name) for name in names}
    finally:
        con.close()


_REFERENCE: dict[str, tuple[Any, ...]] = {}


def _shape(con: sqlite3.Connection, name: str) -> tuple[Any, ...]:
    """(type, table, normalised SQL for an index, columns, foreign keys / index columns) of one schema object."""
    type_, tbl, sql, rootpage = con.execute(
        "SELECT type, tbl_name, sql, rootpage FROM sqlite_master WHERE name=?", (name,)
    ).fetchone()
    if type_ == "table":
        if not isinstance(sql, str) or sql.lstrip().upper().startswith("CREATE VIRTUAL") or not rootpage:
            return ("virtual table", tbl, None, (), ())
        cols = tuple(con.execute('SELECT cid, name, type, "notnull", dflt_value, pk, hidden FROM pragma_table_xinfo(?)',
                                 (name,)).fetchall())
        fks = tuple(con.execute("SELECT * FROM pragma_foreign_key_list(?)", (name,)).fetchall())
        return (type_, tbl, None, cols, fks)
    text = " ".join(sql.split()) if isinstance(sql, str) else None
    cols = tuple(con.execute("SELECT * FROM pragma_index_xinfo(?)", (name,)).fetchall())
    return (type_, tbl, text, cols, ())


def _json_depth_ok(doc: Any) -> bool:
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return False
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
    return True


@dataclass(frozen=True)
class RunRow:
    id: int
    started: float
    finished: float | None
    kind: str
    preset: str | None
    status: str
    accel: str | None
    env: dict[str, Any]
    args: dict[str, Any]
    cells: int
    failed: int
    note: str | None = None  # --note, then what happened to the run ("interrupted")


@dataclass(frozen=True)
class CellRow:
    id: int
    run_id: int
    key: str
    config: dict[str, Any]
    workload: str
    rep: int
    status: str
    error: str | None
    accel: str | None
    duration_s: float | None
    metrics: dict[str, float]
    attempts: int = 1  # 2: the first try failed and the cell was measured again (its error: first_error)
    first_error: str | None = None


class Store:
    def __init__(self, path: Path, *, must_exist: bool = False) -> None:
        """``must_exist``: for commands that only read: a database that is not there is a typo to
        report, not one to create (with its directories)."""
        self.path = path
        if must_exist and not path.is_file():
            what = "is not a file" if path.exists() else "no such results database"
            raise KvmtuneError(f"{path}: {what} (benchmarks create it; --db names another)")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, factory=_Connection)
        except (OSError, sqlite3.Error) as exc:
            raise KvmtuneError(f"{path}: cannot open results database ({exc})") from None
        conn = self.db
        assert isinstance(conn, _Connection)
        try:
            # before the first look at the file: its schema and rows are someone else's input
            conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
            conn.set_progress_handler(conn.past_deadline, PROGRESS_STEPS)
            conn.execute("PRAGMA trusted_schema = OFF")
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("BEGIN")  # the version and the schema it describes read together (another kvmtune may be creating it)
            try:
                version = int(conn.execute("PRAGMA user_version").fetchone()[0])
                if version > SCHEMA_VERSION:
                    raise KvmtuneError(
                        f"{path}: results database schema {version} is newer than this kvmtune ({SCHEMA_VERSION}); "
                        "upgrade kvmtune"
                    )
                self._validate(version)  # nothing is written to a database that is not kvmtune's
            finally:
                conn.rollback()
            if version < SCHEMA_VERSION:
                self._create_or_upgrade()
                self._validate(SCHEMA_VERSION)
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                try:
                    conn.execute("PRAGMA journal_mode = WAL")
                except sqlite3.OperationalError:
                    pass  # read-only file or directory, or a file system without shared memory: stay in rollback mode
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise KvmtuneError(f"{path}: not a kvmtune results database ({exc}{_hint(exc)})") from None
        except KvmtuneError:
            conn.close()
            raise

    def _not_ours(self, why: str) -> KvmtuneError:
        return KvmtuneError(f"{self.path}: not a kvmtune results database ({why}); left as it is")

    def _validate(self, version: int) -> None:
        """Raise unless every object in the file is one kvmtune makes, in the shape of ``version``: the
        benchmark tables (none at version 0, where only the fleet tables may exist), the fleet tables or not."""
        if version < 0:
            raise self._not_ours(f"schema version {version}")
        if not _REFERENCE:
            _REFERENCE.update(_reference())
        objects = self.db.execute("SELECT type, name FROM sqlite_master LIMIT 100").fetchall()
        if len(objects) >= 100:
            raise self._not_ours("too many schema objects")
        found = set()
        for type_, name in objects:
            shown = repr(name)[:60]
            if type_ not in ("table", "index"):
                raise self._not_ours(f"it holds a {str(type_)[:10]} {shown}; kvmtune makes no views or triggers")
            if not isinstance(name, str) or name not in _REFERENCE:
                raise self._not_ours(f"unexpected {type_} {shown}")
            expected = _REFERENCE[name]
            dropped = _dropped(name, version)
            if dropped:
                expected = (*expected[:3], expected[3][:-dropped], expected[4])
            shapes = [expected] + [(*expected[:3], expected[3][:-n], expected[4])
                                   for n in range(1, len(FLEET_ADDED.get(name, ())) + 1)]
            if _shape(self.db, name) not in shapes:
                raise self._not_ours(f"{type_} {shown} is not the one kvmtune creates (schema {version})")
            found.add(name)
        bench = {n for n, shape in _REFERENCE.items() if not n.startswith(("fleet_", "sqlite_autoindex_fleet_"))}
        if version == 0 and found & bench:
            raise self._not_ours("unversioned benchmark tables present")
        if version > 0 and bench - found:
            raise self._not_ours(f"schema {version} without {', '.join(sorted(bench - found))}")

    def _create_or_upgrade(self) -> None:
        """Schema and user_version in one write transaction: a second kvmtune creating the same new
        database waits for it and then finds it made. Only after :meth:`_validate`."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            version = int(self.db.execute("PRAGMA user_version").fetchone()[0])
            if version == 0:
                for statement in SCHEMA.split(";"):
                    if statement.strip():
                        self.db.execute(statement)
            else:
                for step in range(version, SCHEMA_VERSION):
                    for statement in MIGRATIONS[step]:
                        self.db.execute(statement)
            self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self.db.commit()
        except BaseException:
            self.db.rollback()
            raise

    def ensure_fleet_tables(self) -> None:
        """The fleet history's tables, made or brought up to date (only on a database :meth:`_validate` passed)."""
        with self.db:
            for statement in FLEET_SCHEMA.split(";"):
                if statement.strip():
                    self.db.execute(statement)
            for table, added in FLEET_ADDED.items():
                have = {r[1] for r in self.db.execute("SELECT * FROM pragma_table_info(?)", (table,))}
                for column, decl in added:
                    if column not in have:
                        self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")

    @_one_line
    def check(self) -> None:
        """Raise (one line) unless SQLite's quick check passes: run before measuring, not after."""
        rows = [r[0] for r in self.db.execute("PRAGMA quick_check(3)").fetchall()]
        if rows != ["ok"]:
            raise KvmtuneError(
                f"{self.path}: results database is damaged ({'; '.join(str(r) for r in rows)[:200]}); "
                "nothing measured (keep a copy and use another --db)"
            )

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ writing

    @_one_line
    def begin_run(
        self,
        kind: str,
        env: Mapping[str, Any],
        args: Mapping[str, Any],
        preset: str | None = None,
        owner: Owner | None = None,
    ) -> int:
        owner = owner or Owner.this_process()
        with self.db:
            cur = self.db.execute(
                "INSERT INTO runs (started, kind, preset, status, accel, env, args, owner_pid, owner_start, owner_boot)"
                " VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    time.time(),
                    kind,
                    preset,
                    "running",
                    env.get("accel"),
                    json.dumps(env, sort_keys=True),
                    json.dumps(args, sort_keys=True, default=str),
                    owner.pid,
                    owner.start,
                    owner.boot,
                ),
            )
        assert cur.lastrowid is not None
        return cur.lastrowid

    @_one_line
    def finish_run(self, run_id: int, status: str, note: str | None = None) -> None:
        with self.db:
            self.db.execute("UPDATE runs SET finished=?, status=?, note=? WHERE id=?", (time.time(), status, note, run_id))

    @_one_line
    def add_cell(
        self,
        run_id: int,
        key: str,
        config: Mapping[str, Any],
        workload: str,
        status: str,
        metrics: Mapping[str, float] | None = None,
        *,
        rep: int = 0,
        error: str | None = None,
        accel: str | None = None,
        started: float | None = None,
        duration_s: float | None = None,
        raw: str | None = None,
        samples: Iterable[tuple[float, str, float]] = (),
        attempts: int = 1,
        first_error: str | None = None,
    ) -> int:
        with self.db:
            cur = self.db.execute(
                "INSERT INTO cells (run_id, key, config, workload, rep, status, error, accel, started, duration_s, raw,"
                " attempts, first_error) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (run_id, key, json.dumps(config, sort_keys=True), workload, rep, status, error, accel, started, duration_s, raw,
                 attempts, first_error),
            )
            cell_id = cur.lastrowid
            assert cell_id is not None
            if metrics:
                self.db.executemany(
                    "INSERT INTO metrics (cell_id, name, value) VALUES (?,?,?)",
                    [(cell_id, k, float(v)) for k, v in metrics.items() if v is not None],
                )
            self.db.executemany(
                "INSERT INTO samples (cell_id, t, name, value) VALUES (?,?,?,?)",
                [(cell_id, t, n, v) for t, n, v in samples],
            )
        return cell_id

    # ------------------------------------------------------------------ reading

    def _bad(self, where: str, problem: str) -> KvmtuneError:
        return KvmtuneError(f"{self.path}: {where}: {problem} (not what kvmtune stores: a damaged or hostile database)")

    def _check(self, where: str, row: tuple[Any, ...], columns: tuple[tuple[str, tuple[type, ...]], ...]) -> None:
        """Each column of ``row`` of one of its SQL types (``type(None)`` where NULL is allowed)."""
        for value, (name, kinds) in zip(row, columns, strict=True):
            if type(value) not in kinds:
                raise self._bad(where, f"{name} is {type(value).__name__}, not {' or '.join(k.__name__ for k in kinds)}")

    def _json_object(self, where: str, name: str, text: Any, known: Mapping[str, tuple[type, ...]]) -> dict[str, Any]:
        """A stored JSON object, bounded in size and depth, its known keys of the types kvmtune's readers expect."""
        if not isinstance(text, str):
            raise self._bad(where, f"{name} is {type(text).__name__}, not JSON text")
        if len(text) > MAX_JSON_CHARS:
            raise self._bad(where, f"{name} is larger than {MAX_JSON_CHARS >> 20} MiB")
        try:
            doc = json.loads(text)
        except RecursionError:
            raise self._bad(where, f"{name} is nested deeper than {MAX_JSON_DEPTH} levels") from None
        except ValueError as exc:
            raise self._bad(where, f"{name} is not JSON ({str(exc)[:80]})") from None
        if not isinstance(doc, dict):
            raise self._bad(where, f"{name} is a JSON {type(doc).__name__}, not an object")
        if not _json_depth_ok(doc):
            raise self._bad(where, f"{name} is nested deeper than {MAX_JSON_DEPTH} levels")
        for key, kinds in known.items():
            value = doc.get(key)
            if value is not None and not isinstance(value, kinds):
                raise self._bad(where, f"{name}[{key!r}] is a JSON {type(value).__name__}")
        return doc

    _RUN_COLUMNS = (
        ("id", (int,)), ("started", (float, int)), ("finished", (float, int, type(None))), ("kind", (str,)),
        ("preset", (str, type(None))), ("status", (str,)), ("accel", (str, type(None))), ("env", (str,)), ("args", (str,)),
        ("cells", (int,)), ("failed", (int,)), ("note", (str, type(None))), ("owner_pid", (int, type(None))),
        ("owner_start", (str, type(None))), ("owner_boot", (str, type(None))),
    )
    _RUN_SELECT = (
        "SELECT r.id, r.started, r.finished, r.kind, r.preset, r.status, r.accel, r.env, r.args,"
        " (SELECT count(*) FROM cells c WHERE c.run_id=r.id),"
        " (SELECT count(*) FROM cells c WHERE c.run_id=r.id AND c.status!='ok'), r.note,"
        " r.owner_pid, r.owner_start, r.owner_boot"
        " FROM runs r"
    )

    def _run_row(self, r: tuple[Any, ...], host: HostRoot) -> RunRow:
        where = f"run {r[0]}" if type(r[0]) is int else "a run"
        self._check(where, r, self._RUN_COLUMNS)
        if not 0 <= r[1] < 1e11 or (r[2] is not None and not 0 <= r[2] < 1e11):
            raise self._bad(where, "started or finished is not a time")
        env = self._json_object(where, "env", r[7], ENV_TYPES)
        topologies = env.get("topologies")
        if topologies is not None and not all(isinstance(t, str) for t in topologies):
            raise self._bad(where, "env['topologies'] is not a list of strings")
        args = self._json_object(where, "args", r[8], {})
        status = r[5]
        if status == "running" and r[12] is not None and not Owner(r[12], r[13] or "", r[14] or "").alive(host):
            status = "abandoned"  # its owner died without closing it (SIGKILL, power loss)
        return RunRow(r[0], float(r[1]), None if r[2] is None else float(r[2]), r[3], r[4], status, r[6], env, args, r[9],
                      r[10], r[11])

    @_one_line
    def runs(self) -> list[RunRow]:
        host = HostRoot()
        return [self._run_row(r, host) for r in self.db.execute(self._RUN_SELECT + " ORDER BY r.id")]

    @_one_line
    def run(self, run_id: int) -> RunRow:
        row = self.db.execute(self._RUN_SELECT + " WHERE r.id=?", (run_id,)).fetchone()
        if row is None:
            raise KvmtuneError(f"{self.path}: no run {run_id} (see 'kvmtune results list')")
        return self._run_row(row, HostRoot())

    _CELL_COLUMNS = (
        ("id", (int,)), ("run_id", (int,)), ("key", (str,)), ("config", (str,)), ("workload", (str,)), ("rep", (int,)),
        ("status", (str,)), ("error", (str, type(None))), ("accel", (str, type(None))),
        ("duration_s", (float, int, type(None))), ("attempts", (int,)), ("first_error", (str, type(None))),
    )

    @_one_line
    def cells(self, run_id: int) -> list[CellRow]:
        metrics: dict[int, dict[str, float]] = {}
        for row in self.db.execute(
            "SELECT m.cell_id, m.name, m.value FROM metrics m JOIN cells c ON c.id=m.cell_id WHERE c.run_id=?",
            (run_id,),
        ):
            self._check(f"run {run_id}: a metric", row, (("cell_id", (int,)), ("name", (str,)), ("value", (float, int))))
            metrics.setdefault(row[0], {})[row[1]] = float(row[2])
        out = []
        for r in self.db.execute(
            "SELECT id, run_id, key, config, workload, rep, status, error, accel, duration_s, attempts, first_error"
            " FROM cells"
            " WHERE run_id=? ORDER BY id",
            (run_id,),
        ):
            where = f"run {run_id}: cell {r[0]}"
            self._check(where, r, self._CELL_COLUMNS)
            config = self._json_object(where, "config", r[3], CONFIG_TYPES)
            duration = None if r[9] is None else float(r[9])
            out.append(CellRow(r[0], r[1], r[2], config, r[4], r[5], r[6], r[7], r[8], duration, metrics.get(r[0], {}),
                               r[10], r[11]))
        return out

    @_one_line
    def samples(self, cell_id: int) -> list[tuple[float, str, float]]:
        out = []
        for row in self.db.execute("SELECT t, name, value FROM samples WHERE cell_id=? ORDER BY t", (cell_id,)):
            self._check(f"cell {cell_id}: a sample", row, (("t", (float, int)), ("name", (str,)), ("value", (float, int))))
            out.append((float(row[0]), row[1], float(row[2])))
        return out
