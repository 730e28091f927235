"""The SQLite results store."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from kvmtune.errors import KvmtuneError
from kvmtune.lab.store import SCHEMA_VERSION, Store


def test_roundtrip_runs_cells_metrics_samples(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    with Store(db) as st:
        rid = st.begin_run("storage", {"accel": "tcg", "qemu": "7.2"}, {"runtime": 1}, preset="seed-003")
        cid = st.add_cell(rid, "k|w", {"bus": "ide"}, "w", "ok", {"iops": 10.0, "bw_Bps": 40960.0},
                          accel="tcg", samples=[(0.0, "host_ios", 1.0), (0.5, "host_ios", 9.0)])
        st.add_cell(rid, "k2|w", {"bus": "ide"}, "w", "error", error="impossible combination: x", accel="tcg")
        st.finish_run(rid, "errors")
    with Store(db) as st:
        (run,) = st.runs()
        assert (run.kind, run.preset, run.status, run.accel, run.cells, run.failed) == (
            "storage", "seed-003", "errors", "tcg", 2, 1,
        )
        assert run.env["qemu"] == "7.2"
        cells = st.cells(rid)
        assert cells[0].metrics == {"iops": 10.0, "bw_Bps": 40960.0} and cells[0].config == {"bus": "ide"}
        assert cells[1].error == "impossible combination: x"
        assert st.samples(cid) == [(0.0, "host_ios", 1.0), (0.5, "host_ios", 9.0)]
        assert sqlite3.connect(db).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        with pytest.raises(KvmtuneError, match="no run 99"):
            st.run(99)


def test_refuses_a_newer_schema_and_foreign_databases(tmp_path: Path) -> None:
    newer = tmp_path / "newer.db"
    con = sqlite3.connect(newer)
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    con.close()
    with pytest.raises(KvmtuneError, match="newer than this kvmtune"):
        Store(newer)
    foreign = tmp_path / "foreign.db"
    con = sqlite3.connect(foreign)
    con.execute("CREATE TABLE x (a)")
    con.close()
    with pytest.raises(KvmtuneError, match="not a kvmtune results database"):
        Store(foreign)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(KvmtuneError, match=r"junk\.db"):
        Store(junk)


def test_a_version_2_database_gets_the_retry_columns_and_keeps_its_cells(tmp_path: Path) -> None:
    """Schema 3 (issue 50) adds cells.attempts and cells.first_error; a schema-2 cell reads back as one try."""
    from kvmtune.lab.store import SCHEMA

    db = tmp_path / "v2.db"
    con = sqlite3.connect(db)
    con.executescript(SCHEMA.replace(",\n    attempts INTEGER NOT NULL DEFAULT 1,\n    first_error TEXT", "")
                      + "INSERT INTO runs (started, kind, status, env, args) VALUES (1, 'block', 'complete', '{}', '{}');"
                      "INSERT INTO cells (run_id, key, config, workload, status) VALUES (1, 'k|w', '{}', 'w', 'ok');"
                      "PRAGMA user_version = 2;")
    con.close()
    with Store(db) as st:
        assert st.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
        (old,) = st.cells(1)
        assert (old.attempts, old.first_error) == (1, None)
        st.add_cell(1, "k2|w", {}, "w", "ok", {"iops": 1.0}, attempts=2, first_error="fio started this cell early")
        retried = st.cells(1)[1]
        assert (retried.attempts, retried.first_error) == (2, "fio started this cell early")
    with Store(db) as st:  # the upgraded file is one kvmtune accepts as its own
        assert len(st.cells(1)) == 2
