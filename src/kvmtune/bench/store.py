"""The results store: SQLite, schema versioned with ``PRAGMA user_version``.

A *run* is one ``kvmtune bench`` invocation with its environment (kernel,
QEMU, fio versions, accelerator, CPU, host I/O scheduler, arguments). A
*cell* is one configuration × workload × repetition; its numbers are rows in
``metrics`` (name, value) and, for host time series, ``samples``. Raw fio
JSON is kept so statistics can be re-derived later.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvmtune.errors import KvmtuneError

SCHEMA_VERSION = 1

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
    note TEXT
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
            self.db = sqlite3.connect(str(path), timeout=30)
        except (OSError, sqlite3.Error) as exc:
            raise KvmtuneError(f"{path}: cannot open results database ({exc})") from None
        self.db.execute("PRAGMA foreign_keys = ON")
        try:
            version = int(self.db.execute("PRAGMA user_version").fetchone()[0])
        except sqlite3.DatabaseError as exc:
            raise KvmtuneError(f"{path}: not a kvmtune results database ({exc})") from None
        if version == 0:
            tables = self.db.execute("SELECT count(*) FROM sqlite_master WHERE type='table'").fetchone()[0]
            if tables:
                raise KvmtuneError(f"{path}: not a kvmtune results database (unversioned tables present)")
            with self.db:
                self.db.executescript(SCHEMA)
                self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        elif version > SCHEMA_VERSION:
            raise KvmtuneError(
                f"{path}: results database schema {version} is newer than this kvmtune ({SCHEMA_VERSION}); upgrade kvmtune"
            )

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ writing

    def begin_run(self, kind: str, env: Mapping[str, Any], args: Mapping[str, Any], preset: str | None = None) -> int:
        with self.db:
            cur = self.db.execute(
                "INSERT INTO runs (started, kind, preset, status, accel, env, args) VALUES (?,?,?,?,?,?,?)",
                (
                    time.time(),
                    kind,
                    preset,
                    "running",
                    env.get("accel"),
                    json.dumps(env, sort_keys=True),
                    json.dumps(args, sort_keys=True, default=str),
                ),
            )
        assert cur.lastrowid is not None
        return cur.lastrowid

    def finish_run(self, run_id: int, status: str, note: str | None = None) -> None:
        with self.db:
            self.db.execute("UPDATE runs SET finished=?, status=?, note=? WHERE id=?", (time.time(), status, note, run_id))

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

    def runs(self) -> list[RunRow]:
        rows = self.db.execute(
            "SELECT r.id, r.started, r.finished, r.kind, r.preset, r.status, r.accel, r.env, r.args,"
            " (SELECT count(*) FROM cells c WHERE c.run_id=r.id),"
            " (SELECT count(*) FROM cells c WHERE c.run_id=r.id AND c.status!='ok')"
            " FROM runs r ORDER BY r.id"
        ).fetchall()
        return [RunRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], json.loads(r[7]), json.loads(r[8]), r[9], r[10]) for r in rows]

    def run(self, run_id: int) -> RunRow:
        for r in self.runs():
            if r.id == run_id:
                return r
        raise KvmtuneError(f"{self.path}: no run {run_id} (see 'kvmtune results list')")

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

    def samples(self, cell_id: int) -> list[tuple[float, str, float]]:
        return [
            (t, n, v) for t, n, v in self.db.execute("SELECT t, name, value FROM samples WHERE cell_id=? ORDER BY t", (cell_id,))
        ]
