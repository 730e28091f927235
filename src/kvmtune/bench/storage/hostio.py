"""Host-side figures read while a guest runs: disk transactions/s (as iostat
computes them from /proc/diskstats) and the CPU time of the QEMU process.

All reads go through :class:`~kvmtune.host.root.HostRoot` and the parsers of
:mod:`kvmtune.host.parsers` (``/proc/diskstats`` is read afresh at every sample).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvmtune.host.facts import HostFacts
from kvmtune.host.parsers import DiskCounters, parse_diskstats
from kvmtune.host.process import process_cpu_s
from kvmtune.host.root import HostRoot

SECTOR = 512


def device_of_path(host: HostRoot, path: str) -> str | None:
    """The block device name (as in /proc/diskstats) holding ``path``, or None (tmpfs, overlay…)."""
    return HostFacts(host).block_device_of(path)


@dataclass
class Snapshot:
    t: float
    disk: DiskCounters | None
    cpu_s: float | None
    extra: dict[str, int] = field(default_factory=dict)  # what the sampler's ``extra`` read at the same moment


def tps(a: Snapshot, b: Snapshot) -> float | None:
    if a.disk is None or b.disk is None or b.t <= a.t:
        return None
    return (b.disk.ios - a.disk.ios) / (b.t - a.t)


def write_kBps(a: Snapshot, b: Snapshot) -> float | None:
    if a.disk is None or b.disk is None or b.t <= a.t:
        return None
    return (b.disk.sectors_written - a.disk.sectors_written) * SECTOR / 1024 / (b.t - a.t)


@dataclass
class HostSampler:
    """Takes snapshots of one disk and one process, on demand and every ``interval`` seconds."""

    host: HostRoot
    device: str | None
    pid: int | None = None
    interval: float = 0.5
    extra: Callable[[], dict[str, int]] | None = None  # more figures to read with each snapshot
    series: list[Snapshot] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def snap(self) -> Snapshot:
        disk = None
        if self.device:
            text = self.host.read_optional("/proc/diskstats") or ""
            disk = parse_diskstats(text).get(self.device)
        cpu = process_cpu_s(self.host, self.pid) if self.pid else None
        return Snapshot(time.monotonic(), disk, cpu, self.extra() if self.extra else {})

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.series.append(self.snap())

    def start(self) -> None:
        self.series.append(self.snap())
        self._thread = threading.Thread(target=self._loop, name="kvmtune-hostio", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self.series.append(self.snap())


def scheduler_of(host: HostRoot, device: str | None) -> str | None:
    """The active I/O scheduler of ``device`` or, for a partition, of its disk."""
    return HostFacts(host).io_scheduler(device) if device else None
