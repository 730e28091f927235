"""Issue 37, item 3: the ETA on ``kvmtune verify``'s progress line. A guest-tier finding boots two probe guests
(tens of seconds) where a block-tier one takes seconds, so the pace of the cells done so far says nothing about
the ones to come: the benchmark's own estimate (``VerifyBenchmark.remaining_seconds``, from ``engine.estimate``)
gives the ETA."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

from kvmtune.audit.finding import Finding, Target
from kvmtune.audit.rule import rule_by_id
from kvmtune.host.root import HostRoot
from kvmtune.lab.runner import BenchRunner, HostBenchLock
from kvmtune.lab.store import Store
from kvmtune.runner import Runner
from kvmtune.verify.engine import START_S, Planned, VerifyBenchmark, VerifyResult, estimate
from kvmtune.verify.experiments import Outcome, Subject, VerifyContext


class Instant:
    """An experiment of a tier that returns at once (what it measured does not matter to the ETA)."""

    def __init__(self, tier: str) -> None:
        self.tier, self.change, self.workload = tier, f"{tier} change", "fio"

    def run(self, ctx: VerifyContext) -> Outcome:
        return Outcome(None, "nothing changed")


def _finding(rule_id: str) -> Finding:
    rule = rule_by_id(rule_id)
    assert rule is not None
    return rule().finding(target=Target("localhost", "g", "disk:vda"), actual="a", expected="b", evidence="/x")


def _bench(tmp_path: Path, tiers: list[str], deadline: float | None = None) -> VerifyBenchmark:
    ctx = VerifyContext(runner=Runner(), host=HostRoot("/"), root="/", workdir=tmp_path, deadline=deadline)
    planned = []
    for tier in tiers:
        f = _finding("KVM-STO-001" if tier == "guest" else "KVM-STO-002")
        planned.append(Planned(VerifyResult(f), Subject(f), Instant(tier)))
    return VerifyBenchmark(planned, ctx, {})


def _etas(tmp_path: Path, bench: VerifyBenchmark) -> list[float | None]:
    """The ETA of each progress line, in seconds (None: the line has none)."""
    stream = io.StringIO()
    with Store(tmp_path / "r.db") as st:
        BenchRunner(st, stream=stream, lock=HostBenchLock(tmp_path / "lock")).run(bench)
    out: list[float | None] = []
    for line in stream.getvalue().splitlines():
        if line.startswith("["):
            m = re.search(r" ETA (\d+)m(\d\d)s ", line)
            out.append(int(m.group(1)) * 60 + int(m.group(2)) if m else None)
    return out


def test_the_eta_counts_the_guest_boots_still_to_come(tmp_path: Path) -> None:
    bench = _bench(tmp_path, ["block", "block", "guest", "block"])
    ctx = bench.ctx
    block, guest = estimate(Instant("block"), ctx), estimate(Instant("guest"), ctx)
    assert guest > 2 * block and guest > START_S["guest"]  # a guest-tier finding boots: longer than a block one
    etas = _etas(tmp_path, bench)
    # the cells done took no time, so the pace would say 0 s: the estimate still has the guest finding ahead
    assert etas == [int(block + guest + block), int(guest + block), int(block), None]


def test_the_eta_never_passes_the_budget(tmp_path: Path) -> None:
    bench = _bench(tmp_path, ["block", "guest", "guest"], deadline=time.monotonic() + 20)
    etas = _etas(tmp_path, bench)
    first = etas[0]
    assert first is not None and 0 < first <= 20  # two guest findings would take longer: the budget ends first
    assert bench.remaining_seconds() == 0.0  # all run


def test_a_benchmark_without_an_estimate_keeps_the_pace(tmp_path: Path) -> None:
    from kvmtune.lab.runner import EstimatesRemaining, _eta

    assert isinstance(_bench(tmp_path, ["block"]), EstimatesRemaining)
    since = time.monotonic() - 60
    assert _eta(since, 3, 12) in (" ETA 3m00s", " ETA 3m01s")  # no estimate: 20 s a cell so far, 9 cells to go
    assert _eta(since, 3, 12, 125.0) == " ETA 2m05s"  # the benchmark's estimate wins over the pace
    assert _eta(0.0, 0, 12, 30.0) == " ETA 0m30s"  # and needs no cell done first
    assert _eta(since, 12, 12, 30.0) == ""  # nothing after the last
