"""Runs are never stuck: owners, abandoned runs, one benchmark per host, WAL with two writers,
a new database made once, damaged databases as one line, leftovers of killed runs swept."""

from __future__ import annotations

import io
import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kvmtune.errors import KvmtuneError
from kvmtune.host.root import HostRoot
from kvmtune.lab.leftovers import sweep
from kvmtune.lab.runner import BenchBusy, BenchRunner, Cell, CellSink, HostBenchLock
from kvmtune.lab.store import SCHEMA, SCHEMA_VERSION, Store
from kvmtune.lab.workdir import OWNER_FILE, Scratch, read_owner
from kvmtune.runner import Runner

KVMTUNE = [sys.executable, "-m", "kvmtune"]


@dataclass
class Counting:
    """A benchmark of ``cells`` trivial cells; counts whether it measured anything."""

    cells: int = 2
    kind: str = "test"
    measured: list[int] = field(default_factory=list)

    def plan(self) -> str:
        return f"{self.cells} cells"

    def planned_cells(self) -> int:
        return self.cells

    def environment(self) -> dict[str, Any]:
        return {"accel": "tcg"}

    def describe(self, cell: Cell) -> str:
        return "x"

    def execute(self, sink: CellSink) -> None:
        for i in range(self.cells):
            self.measured.append(i)
            sink.record(Cell("cfg", {"i": i}, f"w{i}", "ok", {"x": float(i)}))

    def cleanup(self) -> list[str]:
        return []


BEGIN_AND_HANG = r"""
import sys, time
from pathlib import Path
from kvmtune.lab.store import Store
st = Store(Path(sys.argv[1]))
run = st.begin_run("storage", {"accel": "tcg"}, {})
print(run, flush=True)
time.sleep(120)
"""


def test_a_killed_runs_row_reads_abandoned_and_a_live_one_running(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    procs = [subprocess.Popen([sys.executable, "-c", BEGIN_AND_HANG, str(db)], stdout=subprocess.PIPE) for _ in range(2)]
    try:
        ids = [int(p.stdout.readline()) for p in procs if p.stdout is not None]
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
        with Store(db) as st:
            status = {r.id: r.status for r in st.runs()}
        assert status == {ids[0]: "abandoned", ids[1]: "running"}
        listed = subprocess.run([*KVMTUNE, "results", "list", "--db", str(db)], capture_output=True, text=True, check=False)
        assert listed.returncode == 0, listed.stderr
        lines = {int(ln.split()[0]): ln for ln in listed.stdout.splitlines()[1:]}
        assert " abandoned " in lines[ids[0]] and " running " in lines[ids[1]]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_reused_pid_is_not_the_owner(tmp_path: Path) -> None:
    """Same pid, other start time (pid reuse) or other boot: abandoned."""
    with Store(tmp_path / "r.db") as st:
        from kvmtune.lab.store import Owner

        me = Owner.this_process()
        a = st.begin_run("storage", {}, {}, owner=Owner(me.pid, str(int(me.start) + 1), me.boot))
        b = st.begin_run("storage", {}, {}, owner=Owner(me.pid, me.start, "another-boot"))
        c = st.begin_run("storage", {}, {}, owner=me)
        assert {r.id: r.status for r in st.runs()} == {a: "abandoned", b: "abandoned", c: "running"}


TWO_WRITERS = r"""
import sys
from pathlib import Path
from kvmtune.lab.store import Store
st = Store(Path(sys.argv[1]))
run = st.begin_run("test", {}, {})
for i in range(int(sys.argv[2])):
    st.add_cell(run, f"k{i}", {"i": i}, "w", "ok", {"x": float(i)}, samples=[(0.0, "s", 1.0)] * 20)
st.finish_run(run, "complete")
print("done", flush=True)
"""


def test_wal_and_two_writers_at_once(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    Store(db).close()
    procs = [subprocess.Popen([sys.executable, "-c", TWO_WRITERS, str(db), "150"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1].decode()[-400:] for o in outs]
    with Store(db) as st:
        assert st.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        runs = st.runs()
        assert [r.status for r in runs] == ["complete", "complete"]
        assert [r.cells for r in runs] == [150, 150]


FIRST_OPEN = r"""
import sys, time
from pathlib import Path
t = float(sys.argv[2])
while time.time() < t:
    pass
from kvmtune.lab.store import Store
Store(Path(sys.argv[1])).begin_run("test", {}, {})
"""


def test_two_first_benchmarks_on_a_new_database(tmp_path: Path) -> None:
    """Schema and user_version in one transaction: neither sees a half-made database."""
    for attempt in range(3):
        db = tmp_path / f"new{attempt}.db"
        start = time.time() + 1.0
        procs = [subprocess.Popen([sys.executable, "-c", FIRST_OPEN, str(db), str(start)], stderr=subprocess.PIPE)
                 for _ in range(4)]
        errs = [p.communicate(timeout=60)[1].decode() for p in procs]
        assert [p.returncode for p in procs] == [0] * 4, errs
        with Store(db) as st:
            assert len(st.runs()) == 4


def test_a_version_1_database_is_upgraded_in_place(tmp_path: Path) -> None:
    db = tmp_path / "v1.db"
    con = sqlite3.connect(db)
    con.executescript(  # schema 1 as kvmtune created it: without runs' three owner columns and cells' two retry columns
        SCHEMA.replace(",\n    owner_pid INTEGER,\n    owner_start TEXT,\n    owner_boot TEXT", "")
        .replace(",\n    attempts INTEGER NOT NULL DEFAULT 1,\n    first_error TEXT", "") +
        "INSERT INTO runs (started, kind, status, env, args) VALUES (1, 'storage', 'running', '{}', '{}');"
        "PRAGMA user_version = 1;"
    )
    con.close()
    with Store(db) as st:
        assert st.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert [r.status for r in st.runs()] == ["running"]  # no owner recorded: cannot say it is abandoned


def _damage(db: Path) -> None:
    with Store(db) as st:
        run = st.begin_run("test", {}, {})
        for i in range(300):
            st.add_cell(run, f"k{i}", {"pad": "x" * 400}, "w", "ok", {"x": 1.0})
        st.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(db.read_bytes())
    page = 4096
    for n in range(2, len(data) // page):
        data[n * page + 100 : n * page + 300] = os.urandom(200)
    db.write_bytes(bytes(data))


def test_damaged_pages_are_one_line_and_nothing_is_measured(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    _damage(db)
    res = subprocess.run([*KVMTUNE, "results", "list", "--db", str(db)], capture_output=True, text=True, check=False)
    assert res.returncode == 2
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert str(db) in res.stderr
    bench = Counting()
    try:
        store = Store(db)
    except KvmtuneError:
        return  # refused at open: nothing measured either
    with store, pytest.raises(KvmtuneError, match=r"damaged|malformed"):
        BenchRunner(store, stream=io.StringIO()).run(bench)
    assert bench.measured == []


def test_a_second_benchmark_on_the_host_is_refused_naming_the_first(tmp_path: Path) -> None:
    lock_path = tmp_path / "bench.lock"
    first = HostBenchLock(lock_path)
    first.acquire()
    first.describe({"pid": 4242, "run": 7, "kind": "storage", "db": "/x/results.db"})
    bench = Counting()
    try:
        with Store(tmp_path / "r.db") as st:
            with pytest.raises(BenchBusy) as err:
                BenchRunner(st, stream=io.StringIO(), lock=HostBenchLock(lock_path)).run(bench)
            assert "run 7 (storage) in /x/results.db, pid 4242" in str(err.value)
            assert "\n" not in str(err.value)
            assert st.runs() == [] and bench.measured == []
    finally:
        first.release()
    with Store(tmp_path / "r.db") as st:  # once the first is gone, the host is free
        out = BenchRunner(st, stream=io.StringIO(), lock=HostBenchLock(lock_path)).run(bench)
        assert out.status == "complete"


def test_the_lock_goes_with_a_killed_holder(tmp_path: Path) -> None:
    lock_path = tmp_path / "bench.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys,time\nfrom pathlib import Path\nfrom kvmtune.lab.runner import HostBenchLock\n"
         "HostBenchLock(Path(sys.argv[1])).acquire(); print('held', flush=True); time.sleep(60)", str(lock_path)],
        stdout=subprocess.PIPE,
    )
    assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
    with pytest.raises(BenchBusy, match=f"pid {holder.pid}"):
        HostBenchLock(lock_path).acquire()
    holder.kill()
    holder.wait()
    lock = HostBenchLock(lock_path)
    lock.acquire()
    lock.release()


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_a_benchmark_leaves_no_scratch_directory(tmp_path: Path) -> None:
    from kvmtune.bench.storage.guest import StorageContext
    from kvmtune.bench.storage.quick import QuickBenchmark, QuickPlan, default_quick_configs
    from kvmtune.lab.accel import AccelChoice

    runner = Runner()
    scratch = Scratch(tmp_path / "work" / "scratch-1", runner)
    assert read_owner(scratch.root) is not None  # marked while it lives
    ctx = StorageContext(runner=runner, host=HostRoot(), accel=AccelChoice("none", "test", 0.0), scratch=scratch,
                         disk_mib=16)
    with Store(tmp_path / "r.db") as st:
        out = BenchRunner(st, stream=io.StringIO(), workdir=tmp_path / "work").run(
            QuickBenchmark(ctx, QuickPlan(default_quick_configs()[:1], count=64))
        )
    assert out.status == "complete", out.cells
    assert list((tmp_path / "work").iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="loop devices need root")
def test_sweep_removes_a_dead_owners_scratch_with_its_loop_device(tmp_path: Path) -> None:
    runner, host = Runner(), HostRoot()
    dead = tmp_path / "scratch-100"
    dead.mkdir()
    (dead / OWNER_FILE).write_text(f'{{"pid": {_dead_pid()}, "start": "1", "boot": ""}}')
    img = dead / "disk.img"
    img.write_bytes(b"\0" * (1 << 20))
    res = runner.run(["losetup", "--find", "--show", str(img)])
    assert res.ok, res.stderr
    loop = res.stdout.strip()
    empty = tmp_path / "scratch-200"
    empty.mkdir()
    live = Scratch(tmp_path / "scratch-300", runner)
    live.add_file(live.path("x")).write_bytes(b"x")
    foreign = tmp_path / "scratch-400"  # not marked as kvmtune's: not touched
    foreign.mkdir()
    (foreign / "mine").write_text("user data")
    try:
        kept = sweep(runner, host, tmp_path, keep=True)
        assert f"loop {loop}" in kept.found and dead.exists()
        assert kept.line() is not None and "--keep-leftovers" in (kept.line() or "")
        report = sweep(runner, host, tmp_path)
        line = report.line() or ""
        assert f"loop {loop}" in line and "scratch-100/" in line and "scratch-200/" in line
        assert "\n" not in line and report.problems == []
        assert not dead.exists() and not empty.exists()
        assert live.root.exists() and foreign.exists()
        back = (host.read_optional(f"/sys/block/{loop.removeprefix('/dev/')}/loop/backing_file") or "").strip()
        assert not back.startswith(str(dead)), f"{loop} still attached to {back}"
        assert "scratch-" not in (sweep(runner, host, tmp_path).line() or "")
    finally:
        runner.run(["losetup", "-d", loop])
        live.cleanup()


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_sweep_removes_a_killed_runs_namespace_at_any_age_but_not_an_unclaimed_young_one(tmp_path: Path) -> None:
    """A run killed a moment after making its namespace: owner.json (written before the namespace)
    names it and its owner is dead, so the very next start removes it. A namespace that no owner
    record names yet, made seconds ago, may still be getting its owner: kept for the next start."""
    runner, host = Runner(), HostRoot()
    tag = f"{os.getpid() % 100000:x}"[:5]
    killed, unclaimed = f"kvmtune-k{tag}-h0", f"kvmtune-u{tag}-h0"
    for runid, ns, names in ((f"k{tag}", killed, [killed]), (f"u{tag}", unclaimed, [])):
        rundir = tmp_path / "net" / runid
        rundir.mkdir(parents=True)
        (rundir / OWNER_FILE).write_text(f'{{"pid": {_dead_pid()}, "starttime": "1", "namespaces": {names!r}}}'.replace("'", '"'))
        assert runner.run(["ip", "netns", "add", ns]).ok
    try:
        report = sweep(runner, host, tmp_path)
        listed = runner.run(["ip", "netns", "list"]).stdout
        assert killed in report.found and killed not in listed, report
        assert unclaimed in listed and unclaimed not in report.found, report
    finally:
        for ns in (killed, unclaimed):
            runner.run(["ip", "netns", "del", ns])
