"""Statistics for comparing runs: medians, and B against A as a ratio of geometric means with Welch's 95 %
interval on the logarithms (:func:`ratio_diff`), expressed in % of run A: an interval that cannot reach
below −100 %, symmetric in "times faster / slower".

A difference gets a direction only when the whole interval lies beyond ``threshold`` (5 % by default), "no
measurable effect" only when it lies wholly inside it, the rule of :mod:`kvmtune.lab.vocabulary`.
:func:`welch_diff` (a linear difference of means) is left for figures that can be zero.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvmtune.lab.metrics import Better, lookup
from kvmtune.lab.store import CellRow
from kvmtune.lab.vocabulary import HELPS, INCONCLUSIVE, NO_EFFECT, effect

# two-sided 95 % Student t quantiles for 1..30 degrees of freedom
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)

DEFAULT_METRICS = ("iops", "bw_Bps", "clat_p99_us", "guest_cpu_busy_pct", "qemu_cpu_pct", "host_tps", "host_tps_per_vm")


def t95(df: float) -> float:
    if df < 1:
        return float("inf")
    if df <= 30:
        return _T95[int(df) - 1]
    return 1.960 + 2.4 / df  # close to the table beyond 30


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def stdev(xs: Sequence[float]) -> float:
    if len(xs) < 2:
        return 0.0
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


@dataclass(frozen=True)
class Diff:
    key: str
    metric: str
    n_a: int
    n_b: int
    mean_a: float  # the centre of each side: the median for ratio_diff, the mean for welch_diff
    mean_b: float
    sd_a: float
    sd_b: float
    diff_pct: float | None  # (B - A) / A in %
    ci_pct: tuple[float, float] | None  # 95 % interval of diff_pct
    better: str  # "A", "B", "same", "inconclusive", "unknown", "differs" (a metric with no better direction)

    def describe(self) -> str:
        if self.diff_pct is None:
            return "n/a"
        s = f"{self.diff_pct:+.1f}%"
        if self.ci_pct is not None:
            s += f" (95% CI {self.ci_pct[0]:+.1f}% … {self.ci_pct[1]:+.1f}%)"
        else:
            s += " (one sample each side: no uncertainty; use --repeat)"
        return s


def welch_diff(a: Sequence[float], b: Sequence[float], metric: str = "iops", key: str = "", threshold: float = 5.0) -> Diff:
    ma, mb = mean(a), mean(b)
    sa, sb = stdev(a), stdev(b)
    if ma == 0:
        return Diff(key, metric, len(a), len(b), ma, mb, sa, sb, None, None, "unknown")
    diff = 100.0 * (mb - ma) / abs(ma)
    ci: tuple[float, float] | None = None
    significant = abs(diff) > threshold
    if len(a) >= 2 and len(b) >= 2:
        va, vb = sa**2 / len(a), sb**2 / len(b)
        se = math.sqrt(va + vb)
        df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1)) if se > 0 else len(a) + len(b) - 2
        half = t95(df) * se
        ci = (100.0 * (mb - ma - half) / abs(ma), 100.0 * (mb - ma + half) / abs(ma))
        significant = significant and (ci[0] > 0 or ci[1] < 0)
    if ci is None:
        better = "unknown"  # one sample a side: no interval, so no claim either way, however small the change
    elif not significant:
        better = "same"
    else:
        entry = lookup(metric)
        if entry is None or entry.better is Better.NEITHER:
            better = "differs"
        else:
            b_higher = diff > 0
            better = "A" if b_higher == (entry.better is Better.LOWER) else "B"
    return Diff(key, metric, len(a), len(b), ma, mb, sa, sb, diff, ci, better)


def log_welch(a: Sequence[float], b: Sequence[float]) -> tuple[float, tuple[float, float] | None]:
    """B/A as the ratio of geometric means, and its 95 % interval (Welch's t on the logarithms; None with one value
    a side). Every value must be positive."""
    la, lb = [math.log(x) for x in a], [math.log(x) for x in b]
    d = mean(lb) - mean(la)
    if len(a) < 2 or len(b) < 2:
        return math.exp(d), None
    va, vb = stdev(la) ** 2 / len(a), stdev(lb) ** 2 / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return math.exp(d), (math.exp(d), math.exp(d))
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = t95(df) * se
    return math.exp(d), (math.exp(d - half), math.exp(d + half))


def ratio_diff(a: Sequence[float], b: Sequence[float], metric: str = "iops", key: str = "", threshold: float = 5.0) -> Diff:
    """B against A in % of A from the log ratio (so the interval stays within −100 % … +∞). ``better``: "B" or "A"
    when the whole interval lies beyond ``threshold``, "same" when it lies wholly inside, "inconclusive" when it
    crosses the band's edge, "unknown" with one value a side or a value that is not positive."""
    ma, mb = median(a), median(b)
    sa, sb = stdev(a), stdev(b)
    if min([*a, *b]) <= 0:
        return Diff(key, metric, len(a), len(b), ma, mb, sa, sb, None, None, "unknown")
    r, interval = log_welch(a, b)
    diff = 100.0 * (r - 1)
    if interval is None:
        return Diff(key, metric, len(a), len(b), ma, mb, sa, sb, diff, None, "unknown")
    ci = (100.0 * (interval[0] - 1), 100.0 * (interval[1] - 1))
    entry = lookup(metric)
    word = effect(interval, threshold, entry is None or entry.better is not Better.LOWER)
    if word == NO_EFFECT:
        better = "same"
    elif word == INCONCLUSIVE:
        better = "inconclusive"
    elif entry is None or entry.better is Better.NEITHER:
        better = "differs"
    else:
        better = "B" if word == HELPS else "A"
    return Diff(key, metric, len(a), len(b), ma, mb, sa, sb, diff, ci, better)


def median(xs: Sequence[float]) -> float:
    ys = sorted(xs)
    mid = len(ys) // 2
    return ys[mid] if len(ys) % 2 else (ys[mid - 1] + ys[mid]) / 2


@dataclass(frozen=True)
class Summary:
    """One cell's figure over its rounds: the median, and a 95 % interval (None with one round).

    The interval is Student's t on the logarithms of the rounds (on the values themselves when one is not
    positive): the interval of the typical value, symmetric on the ratio scale that performance figures
    live on. An interval from order statistics alone needs 6 rounds for 95 % (with 3, the lowest and highest
    round enclose the median only 75 % of the time), so it is not used for the few rounds a run has.
    """

    n: int
    median: float
    low: float | None
    high: float | None

    def text(self, digits: int = 0, scale: float = 1.0) -> str:
        def f(v: float) -> str:
            return f"{v / scale:,.{digits}f}"

        if self.low is None or self.high is None:
            return f"{f(self.median)} (1 round, no interval)"
        return f"{f(self.median)} [{f(self.low)}–{f(self.high)}]"


def summarize(xs: Sequence[float]) -> Summary:
    if not xs:
        raise ValueError("no values to summarize")
    if len(xs) < 2:
        return Summary(len(xs), xs[0], None, None)
    logs = all(x > 0 for x in xs)
    ys = [math.log(x) for x in xs] if logs else list(xs)
    half = t95(len(ys) - 1) * stdev(ys) / math.sqrt(len(ys))
    low, high = mean(ys) - half, mean(ys) + half
    if logs:
        low, high = math.exp(low), math.exp(high)
    return Summary(len(xs), median(xs), low, high)


def cell_summaries(cells: Iterable[CellRow], metrics: Sequence[str] = ("iops", "pct_of_bare_metal")) -> list[dict[str, object]]:
    """Per configuration × workload and metric: rounds, median and 95 % interval of the cells that succeeded."""
    out: list[dict[str, object]] = []
    cells = list(cells)
    for metric in metrics:
        for key, values in group_metric(cells, metric).items():
            s = summarize(values)
            out.append({"key": key, "metric": metric, "rounds": s.n, "median": s.median, "ci95_low": s.low,
                        "ci95_high": s.high})
    return out


def group_metric(cells: Iterable[CellRow], metric: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for c in cells:
        if c.status == "ok" and metric in c.metrics:
            out.setdefault(c.key, []).append(c.metrics[metric])
    return out


def compare_cells(
    a: Sequence[CellRow], b: Sequence[CellRow], metrics: Sequence[str] = DEFAULT_METRICS, threshold: float = 5.0
) -> list[Diff]:
    out = []
    for metric in metrics:
        ga, gb = group_metric(a, metric), group_metric(b, metric)
        for key in sorted(set(ga) & set(gb)):
            out.append(ratio_diff(ga[key], gb[key], metric, key, threshold))
    return out
