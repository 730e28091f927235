"""The one benchmark runner closes its run on every exit path (issue 11 §3)."""

from __future__ import annotations

import io
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kvmtune.bench.storage.guest import StorageContext
from kvmtune.bench.storage.quick import QuickBenchmark, QuickPlan, default_quick_configs
from kvmtune.host.root import HostRoot
from kvmtune.lab.accel import AccelChoice
from kvmtune.lab.runner import BenchRunner, Cell, CellSink
from kvmtune.lab.store import Store
from kvmtune.lab.workdir import Scratch
from kvmtune.runner import Runner


@dataclass
class Scripted:
    """A benchmark that records ``cells`` cells, then does ``then`` (raise, interrupt, or nothing)."""

    cells: int
    then: str = ""
    fail_cell: bool = False
    kind: str = "test"
    cleaned: list[str] = field(default_factory=list)

    def plan(self) -> str:
        return f"{self.cells} cells"

    def planned_cells(self) -> int:
        return self.cells

    def environment(self) -> dict[str, Any]:
        return {"accel": "tcg"}

    def describe(self, cell: Cell) -> str:
        return f"{cell.metrics['x']:.0f} x"

    def execute(self, sink: CellSink) -> None:
        for i in range(self.cells):
            status = "error" if self.fail_cell and i == 0 else "ok"
            sink.record(Cell("cfg", {"i": i}, f"w{i}", status, {"x": float(i)}, error="bad" if status != "ok" else None))
        if self.then == "raise":
            raise RuntimeError("the tier broke mid-run")
        if self.then == "interrupt":
            raise KeyboardInterrupt
        if self.then == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)

    def cleanup(self) -> list[str]:
        self.cleaned.append("done")
        return []


def _run(tmp_path: Path, bench: Scripted) -> tuple[Store, BenchRunner]:
    store = Store(tmp_path / "r.db")
    return store, BenchRunner(store, args={"a": 1}, stream=io.StringIO())


def test_a_benchmark_that_raises_mid_run_closes_its_run_as_failed(tmp_path: Path) -> None:
    bench = Scripted(2, then="raise")
    store, runner = _run(tmp_path, bench)
    with pytest.raises(RuntimeError, match="broke mid-run"):
        runner.run(bench)
    (run,) = store.runs()
    assert run.status == "failed" and run.finished is not None
    assert [c.status for c in store.cells(run.id)] == ["ok", "ok"]  # what was measured before is kept
    assert bench.cleaned == ["done"]
    note = store.db.execute("SELECT note FROM runs WHERE id=?", (run.id,)).fetchone()[0]
    assert note == "RuntimeError: the tier broke mid-run"


@pytest.mark.parametrize("how", ["interrupt", "sigterm"])
def test_ctrl_c_or_sigterm_marks_the_run_partial(tmp_path: Path, how: str) -> None:
    bench = Scripted(1, then=how)
    store, runner = _run(tmp_path, bench)
    before = signal.getsignal(signal.SIGTERM)
    outcome = runner.run(bench)
    assert signal.getsignal(signal.SIGTERM) is before  # handler restored
    assert outcome.status == "partial" and outcome.exit_code == 130
    (run,) = store.runs()
    assert run.status == "partial"
    assert [c.status for c in store.cells(run.id)] == ["ok", "interrupted"]
    assert bench.cleaned == ["done"]


def test_complete_and_errors(tmp_path: Path) -> None:
    store, runner = _run(tmp_path, Scripted(3))
    out = runner.run(Scripted(3))
    assert (out.status, out.exit_code, out.failed, len(out.cells)) == ("complete", 0, 0, 3)
    store2 = Store(tmp_path / "r2.db")
    out = BenchRunner(store2, stream=io.StringIO()).run(Scripted(3, fail_cell=True))
    assert (out.status, out.exit_code, out.failed) == ("errors", 1, 1)
    assert [r.status for r in store.runs()] == ["complete"] and [r.status for r in store2.runs()] == ["errors"]
    assert store2.cells(out.run_id)[0].error == "bad"


class _BrokenStream(io.StringIO):
    """stderr that goes away after the first progress line (a closed pipe, a dead terminal)."""

    def write(self, s: str) -> int:
        if self.getvalue().count("\n") >= 2:  # the run's headline and one progress line
            raise BrokenPipeError(32, "Broken pipe")
        return super().write(s)


def test_a_real_tier_failing_mid_run_closes_its_run_and_removes_its_scratch(tmp_path: Path) -> None:
    runner = Runner()
    scratch = tmp_path / "scratch"
    ctx = StorageContext(runner=runner, host=HostRoot(), accel=AccelChoice("none", "test", 0.0),
                         scratch=Scratch(scratch, runner), disk_mib=16)
    bench = QuickBenchmark(ctx, QuickPlan(default_quick_configs()[:3], count=256))
    store = Store(tmp_path / "r.db")
    with pytest.raises(BrokenPipeError):
        BenchRunner(store, stream=_BrokenStream()).run(bench)
    (run,) = store.runs()
    assert run.status == "failed" and run.kind == "quick"
    assert len(store.cells(run.id)) >= 2  # passes so far were stored; then a progress line failed
    assert not scratch.exists()
