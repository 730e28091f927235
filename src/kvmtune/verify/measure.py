"""The measurement interface every verify experiment implements, and the judge.

A :class:`Probe` measures one number for side ``"A"`` (as it is) or ``"B"`` (as
the fix makes it). :func:`alternate` asks it A, B, A, B, … so that drift of the
machine (other load, the page cache, thermal state) falls on both sides alike,
the way pyperf interleaves its worker processes. :func:`judge` turns the
samples into a ratio B/A with its 95 % interval (Welch's t, from
:mod:`kvmtune.lab.stats`) and a verdict.

The probes here are deliberately thin: the tiers behind them (the block tier's
qemu-storage-daemon + fio, netload between namespaces) own the run lifecycle.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kvmtune.lab.stats import log_welch, mean, welch_diff
from kvmtune.lab.vocabulary import HELPS, HURTS, INCONCLUSIVE, NO_EFFECT, effect

VERDICTS = (HELPS, NO_EFFECT, HURTS, INCONCLUSIVE)  # the vocabulary's words for a change (lab/vocabulary.py)


@dataclass(frozen=True)
class Metric:
    name: str  # e.g. iops, throughput_MBps, allocated_MiB
    unit: str
    higher_is_better: bool
    description: str = ""

    def show(self, value: float) -> str:
        if abs(value) >= 100:
            return f"{value:,.0f} {self.unit}".strip()
        return f"{value:.3g} {self.unit}".strip()


class Probe(Protocol):
    """One measurement of one side; raises :class:`~kvmtune.errors.KvmtuneError` with a one-line reason."""

    metric: Metric

    def sample(self, side: str) -> float: ...


class OutOfTime(Exception):
    """The budget ran out before both sides had a sample."""


@dataclass
class Samples:
    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)
    cut_short: bool = False  # the budget stopped the repeats early


def alternate(probe: Probe, repeat: int, deadline: float | None = None,
              clock: Callable[[], float] = time.monotonic, settled: Callable[[Samples], bool] | None = None,
              until: float | None = None) -> Samples:
    """A, B, A, B, … ``repeat`` times each; then, with ``settled``, more rounds until it says the verdict is settled
    or the per-finding cap ``until`` passes (sequential rounds). Stops early (keeping pairs) once ``deadline``, the
    run-wide budget, passes."""
    out = Samples()
    n = 0
    while n < repeat or (settled is not None and until is not None and clock() < until and not settled(out)):
        if deadline is not None and n > 0 and clock() >= deadline:
            out.cut_short = n < repeat
            break
        out.a.append(probe.sample("A"))
        out.b.append(probe.sample("B"))
        n += 1
    if not out.a:
        raise OutOfTime
    return out


@dataclass(frozen=True)
class Judgement:
    metric: Metric
    before: float  # mean of side A
    after: float  # mean of side B
    ratio: float | None  # after / before
    interval: tuple[float, float] | None  # 95 % interval of the ratio; None with one sample a side
    verdict: str  # helps | no measurable effect | hurts | inconclusive
    n: int  # samples per side
    rounds_to_settle: int | None = None  # inconclusive: about how many rounds a side would settle it

    def describe(self) -> str:
        m = self.metric
        text = f"{m.name} {m.show(self.before)} -> {m.show(self.after)}"
        if self.ratio is None:
            return text + " (no ratio: side A measured 0)"
        text += f", ratio {self.ratio:.2f}"
        if self.interval is not None:
            text += f" [{self.interval[0]:.2f}, {self.interval[1]:.2f}]"
        else:
            text += " [one sample a side: no interval]"
        if self.verdict == INCONCLUSIVE:
            text += (f" after {self.n} rounds a side: the interval crosses the threshold band"
                     + (f"; about {self.rounds_to_settle} rounds a side would settle it" if self.rounds_to_settle else ""))
        return text

    def to_json(self) -> dict[str, object]:
        return {
            "metric": self.metric.name, "unit": self.metric.unit, "higher_is_better": self.metric.higher_is_better,
            "before": self.before, "after": self.after, "ratio": self.ratio,
            "interval_95": list(self.interval) if self.interval else None, "verdict": self.verdict, "n": self.n,
            "rounds_to_settle": self.rounds_to_settle,
        }


def ratio_interval(a: Sequence[float], b: Sequence[float]) -> tuple[float, tuple[float, float] | None]:
    """Ratio of geometric means B/A and its 95 % interval (Welch's t on the logarithms: ``compare``'s statistic).

    On the log scale a ratio's interval stays positive and symmetric in "times faster / slower".
    """
    return log_welch(a, b)


def judge(samples: Samples, metric: Metric, threshold_pct: float = 5.0) -> Judgement:
    """The vocabulary's rule (:func:`kvmtune.lab.vocabulary.effect`): helps / hurts only when the whole 95 %
    interval of B/A lies beyond ``threshold_pct``, no measurable effect only when it lies wholly inside it,
    inconclusive otherwise (with one sample a side there is no interval: always inconclusive)."""
    a, b = samples.a, samples.b
    before, after = mean(a), mean(b)
    if min(a + b) <= 0:
        if before == after:
            return Judgement(metric, before, after, 1.0 if before else None, None,
                             NO_EFFECT if len(a) > 1 else INCONCLUSIVE, len(a))
        # a zero (nothing left allocated, say) has no logarithm: fall back to the plain difference of means
        d = welch_diff(a, b, metric.name, threshold=threshold_pct)
        if d.diff_pct is None:
            return Judgement(metric, before, after, None, None, _direction(after > before, metric), len(a))
        ratio = 1.0 + d.diff_pct / 100.0
        interval = None if d.ci_pct is None else (1.0 + d.ci_pct[0] / 100.0, 1.0 + d.ci_pct[1] / 100.0)
    else:
        ratio, interval = ratio_interval(a, b)
    verdict = effect(interval, threshold_pct, metric.higher_is_better)
    more = rounds_to_settle(ratio, interval, len(a), threshold_pct) if verdict == INCONCLUSIVE else None
    return Judgement(metric, before, after, ratio, interval, verdict, len(a), more)


def rounds_to_settle(ratio: float, interval: tuple[float, float] | None, n: int, threshold_pct: float) -> int | None:
    """Rounds a side that would narrow the interval (on the log scale, shrinking as 1/√n) to clear the band's
    nearer edge: an estimate, from this run's spread."""
    if interval is None or ratio <= 0 or interval[0] <= 0:
        return None
    half = (math.log(interval[1]) - math.log(interval[0])) / 2
    gap = abs(abs(math.log(ratio)) - math.log(1 + threshold_pct / 100))
    if gap <= 0 or half <= 0:
        return None
    return max(n + 1, math.ceil(n * (half / gap) ** 2))


def settles(metric: Metric, threshold_pct: float) -> Callable[[Samples], bool]:
    """For :func:`alternate`: is the verdict of these samples settled (anything but inconclusive)?"""
    return lambda s: len(s.a) >= 2 and judge(s, metric, threshold_pct).verdict != INCONCLUSIVE


def _direction(b_higher: bool, metric: Metric) -> str:
    return HELPS if b_higher == metric.higher_is_better else HURTS
