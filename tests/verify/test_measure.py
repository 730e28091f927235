"""Judging a fix from alternating A/B samples."""

from __future__ import annotations

import pytest

from kvmtune.verify.measure import HELPS, HURTS, NO_EFFECT, Metric, OutOfTime, Samples, alternate, judge, ratio_interval

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


def test_noise_wider_than_the_change_is_no_measurable_effect() -> None:
    j = judge(Samples([100, 300, 50], [160, 90, 250]), IOPS)
    assert j.verdict == NO_EFFECT
    assert j.interval is not None and j.interval[0] < 1.0 < j.interval[1]


def test_change_below_threshold_is_no_measurable_effect_even_when_certain() -> None:
    j = judge(Samples([100.0, 100.1, 99.9], [103.0, 103.1, 102.9]), IOPS, threshold_pct=5.0)
    assert j.interval is not None and j.interval[0] > 1.0
    assert j.verdict == NO_EFFECT
    assert judge(Samples([100.0, 100.1, 99.9], [103.0, 103.1, 102.9]), IOPS, threshold_pct=1.0).verdict == HELPS


def test_one_sample_a_side_has_no_interval_and_no_verdict() -> None:
    j = judge(Samples([100], [200]), IOPS)
    assert j.interval is None and j.verdict == NO_EFFECT
    assert "no interval" in j.describe()


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
