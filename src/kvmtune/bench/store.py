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

SCHEMA_VERSION = 2
BUSY_TIMEOUT_S = 30.0

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
    raw TEXT
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
}


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
    return ""


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
            self.db = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S)
        except (OSError, sqlite3.Error) as exc:
            raise KvmtuneError(f"{path}: cannot open results database ({exc})") from None
        try:
            self.db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            self.db.execute("PRAGMA foreign_keys = ON")
            version = int(self.db.execute("PRAGMA user_version").fetchone()[0])
            if version < SCHEMA_VERSION:
                self._create_or_upgrade()
            elif version > SCHEMA_VERSION:
                raise KvmtuneError(
                    f"{path}: results database schema {version} is newer than this kvmtune ({SCHEMA_VERSION}); "
                    "upgrade kvmtune"
                )
            if self.db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                try:
                    self.db.execute("PRAGMA journal_mode = WAL")
                except sqlite3.OperationalError:
                    pass  # read-only file or directory, or a file system without shared memory: stay in rollback mode
        except sqlite3.DatabaseError as exc:
            self.db.close()
            raise KvmtuneError(f"{path}: not a kvmtune results database ({exc})") from None
        except KvmtuneError:
            self.db.close()
            raise

    def _create_or_upgrade(self) -> None:
        """Schema and user_version in one write transaction: a second kvmtune creating the same new
        database waits for it and then finds it made."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            version = int(self.db.execute("PRAGMA user_version").fetchone()[0])
            if version == 0:
                tables = self.db.execute("SELECT count(*) FROM sqlite_master WHERE type='table'").fetchone()[0]
                if tables:
                    raise KvmtuneError(f"{self.path}: not a kvmtune results database (unversioned tables present)")
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
    ) -> int:
        with self.db:
            cur = self.db.execute(
                "INSERT INTO cells (run_id, key, config, workload, rep, status, error, accel, started, duration_s, raw)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (run_id, key, json.dumps(config, sort_keys=True), workload, rep, status, error, accel, started, duration_s, raw),
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

    @_one_line
    def runs(self) -> list[RunRow]:
        rows = self.db.execute(
            "SELECT r.id, r.started, r.finished, r.kind, r.preset, r.status, r.accel, r.env, r.args,"
            " (SELECT count(*) FROM cells c WHERE c.run_id=r.id),"
            " (SELECT count(*) FROM cells c WHERE c.run_id=r.id AND c.status!='ok'), r.note,"
            " r.owner_pid, r.owner_start, r.owner_boot"
            " FROM runs r ORDER BY r.id"
        ).fetchall()
        host = HostRoot()
        out = []
        for r in rows:
            status = r[5]
            if status == "running" and r[12] is not None and not Owner(r[12], r[13] or "", r[14] or "").alive(host):
                status = "abandoned"  # its owner died without closing it (SIGKILL, power loss)
            out.append(
                RunRow(r[0], r[1], r[2], r[3], r[4], status, r[6], json.loads(r[7]), json.loads(r[8]), r[9], r[10], r[11])
            )
        return out

    def run(self, run_id: int) -> RunRow:
        for r in self.runs():
            if r.id == run_id:
                return r
        raise KvmtuneError(f"{self.path}: no run {run_id} (see 'kvmtune results list')")

    @_one_line
    def cells(self, run_id: int) -> list[CellRow]:
        rows = self.db.execute(
            "SELECT id, run_id, key, config, workload, rep, status, error, accel, duration_s FROM cells"
            " WHERE run_id=? ORDER BY id",
            (run_id,),
        ).fetchall()
        metrics: dict[int, dict[str, float]] = {}
        for cid, name, value in self.db.execute(
            "SELECT m.cell_id, m.name, m.value FROM metrics m JOIN cells c ON c.id=m.cell_id WHERE c.run_id=?",
            (run_id,),
        ):
            metrics.setdefault(cid, {})[name] = value
        return [
            CellRow(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5], r[6], r[7], r[8], r[9], metrics.get(r[0], {})) for r in rows
        ]

    @_one_line
    def samples(self, cell_id: int) -> list[tuple[float, str, float]]:
        return [
            (t, n, v) for t, n, v in self.db.execute("SELECT t, name, value FROM samples WHERE cell_id=? ORDER BY t", (cell_id,))
        ]
