"""What the timing benchmarks under bench/ share: the machine's measuring lock, the load average, a ratio's spread.

A script in bench/<name>/ imports it with ``sys.path.insert(0, str(Path(__file__).resolve().parents[1]))``.
"""

from __future__ import annotations

import fcntl
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
