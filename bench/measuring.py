"""What the timing benchmarks under bench/ share: the machine's measuring lock, the load average, a ratio's spread and
its interval.

A script in bench/<name>/ imports it with ``sys.path.insert(0, str(Path(__file__).resolve().parents[1]))``.
"""

from __future__ import annotations

import fcntl
import math
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK = Path("/tmp/kvmtune-measure.lock")  # timing runs on this machine take turns (flock)


@contextmanager
def measure_lock() -> Iterator[None]:
    """Hold the measuring lock for the timed part of a run."""
    with open(LOCK, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages, or "unknown"."""
    try:
        return " ".join(Path("/proc/loadavg").read_text(encoding="ascii").split()[:3])
    except OSError:
        return "unknown"


def spread(ratios: list[float]) -> str:
    """Median, range and quartiles of per-round ratios, one line."""
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return (f"median {statistics.median(ratios):.2f}, min {min(ratios):.2f}, max {max(ratios):.2f}, "
            f"quartiles {quartiles[0]:.2f}-{quartiles[2]:.2f}")


def log_interval(ratios: list[float]) -> tuple[float, tuple[float, float] | None]:
    """Geometric mean of the per-round ratios and its 95 % interval (t on the logarithms; None with one ratio)."""
    from kvmtune.lab.stats import t95  # here: the scripts that only lock and time need no kvmtune

    logs = [math.log(x) for x in ratios]
    m = statistics.mean(logs)
    if len(logs) < 2:
        return math.exp(m), None
    half = t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(m), (math.exp(m - half), math.exp(m + half))
