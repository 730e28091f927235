"""Judging a fix from alternating A/B samples."""

from __future__ import annotations

import pytest

from kvmtune.lab.vocabulary import HELPS, HURTS, INCONCLUSIVE, NO_EFFECT
from kvmtune.verify.measure import Metric, OutOfTime, Samples, alternate, judge, ratio_interval, settles

IOPS = Metric("iops", "IOPS", True)
LATENCY = Metric("latency", "µs", False)


def test_clear_gain_helps_and_interval_excludes_one() -> None:
    j = judge(Samples([100, 102, 98], [150, 151, 149]), IOPS)
    assert j.verdict == HELPS
    assert j.ratio == pytest.approx(1.5, rel=0.01)
    assert j.interval is not None and 1.0 < j.interval[0] < j.ratio < j.interval[1]


def test_direction_follows_the_metric() -> None:
    assert judge(Samples([100, 101, 99], [150, 151, 149]), LATENCY).verdict == HURTS
    assert judge(Samples([150, 151, 149], [100, 101, 99]), LATENCY).verdict == HELPS


def test_an_interval_wider_than_the_band_is_never_no_measurable_effect() -> None:
    """Seed 003's slow disk after 3 × 1 s a side: ratio 2.24 [0.88, 5.71] is inconclusive, with the rounds to settle it."""
    j = judge(Samples([3780.0, 2100.0, 6900.0], [8507.0, 4300.0, 16000.0]), IOPS)
    assert j.interval is not None and j.interval[0] < 1.0 < j.interval[1]
    assert j.verdict == INCONCLUSIVE and j.rounds_to_settle is not None and j.rounds_to_settle > 3
    assert "the interval crosses the threshold band" in j.describe()
    noisy = judge(Samples([100, 300, 50], [160, 90, 250]), IOPS)
    assert noisy.verdict == INCONCLUSIVE


def test_no_measurable_effect_needs_the_whole_interval_inside_the_band() -> None:
    j = judge(Samples([100.0, 100.1, 99.9], [101.0, 101.1, 100.9]), IOPS, threshold_pct=5.0)
    assert j.interval is not None and j.interval[0] >= 1 / 1.05 and j.interval[1] <= 1.05
    assert j.verdict == NO_EFFECT
    # certain, but the change (+3 %) may still reach past the 1 % threshold: helps
    assert judge(Samples([100.0, 100.1, 99.9], [103.0, 103.1, 102.9]), IOPS, threshold_pct=1.0).verdict == HELPS


def test_one_sample_a_side_has_no_interval_and_no_verdict() -> None:
    j = judge(Samples([100], [200]), IOPS)
    assert j.interval is None and j.verdict == INCONCLUSIVE
    assert "no interval" in j.describe()


class _Noisy:
    """A fix that doubles IOPS, measured with a ±40 % spread that repeats every three samples."""

    metric = IOPS

    def __init__(self) -> None:
        self.n = 0

    def sample(self, side: str) -> float:
        self.n += 1
        return (2.0 if side == "B" else 1.0) * 1000 * (0.6, 1.4, 1.0)[self.n // 2 % 3]


def test_sequential_rounds_go_on_until_the_verdict_settles() -> None:
    probe = _Noisy()
    short = alternate(probe, 3)
    assert judge(short, IOPS).verdict == INCONCLUSIVE
    clock = iter(float(t) for t in range(1000))
    s = alternate(_Noisy(), 3, clock=lambda: next(clock), settled=settles(IOPS, 5.0), until=100.0)
    assert 3 < len(s.a) < 50 and judge(s, IOPS).verdict == HELPS
    capped = iter(float(t) for t in range(1000))
    s = alternate(_Noisy(), 3, clock=lambda: next(capped), settled=lambda _s: False, until=5.0)
    assert len(s.a) == 8  # 3 rounds, then one a clock tick until the per-finding cap (5) stops it


def test_zero_after_a_trim_is_judged_on_the_plain_difference() -> None:
    space = Metric("allocated", "MiB", False)
    j = judge(Samples([64.0, 64.0, 64.0], [0.0, 0.0, 0.0]), space)
    assert j.verdict == HELPS and j.ratio == 0.0


def test_ratio_interval_is_symmetric_on_the_log_scale() -> None:
    r, ci = ratio_interval([10, 11, 9], [20, 22, 18])
    assert ci is not None
    assert r == pytest.approx(2.0, rel=0.01)
    assert ci[0] * ci[1] == pytest.approx(r * r, rel=1e-6)


class _Recorder:
    metric = IOPS

    def __init__(self) -> None:
        self.order: list[str] = []

    def sample(self, side: str) -> float:
        self.order.append(side)
        return 1.0


def test_alternate_interleaves_sides() -> None:
    rec = _Recorder()
    s = alternate(rec, 3)
    assert rec.order == ["A", "B", "A", "B", "A", "B"]
    assert len(s.a) == len(s.b) == 3 and not s.cut_short


def test_alternate_stops_at_the_deadline_keeping_pairs() -> None:
    rec = _Recorder()
    now = iter([5.0, 11.0])
    s = alternate(rec, 5, deadline=10.0, clock=lambda: next(now))
    assert s.cut_short and rec.order == ["A", "B", "A", "B"]


def test_alternate_with_no_time_left_raises() -> None:
    with pytest.raises(OutOfTime):
        alternate(_Recorder(), 0)
