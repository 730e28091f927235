"""Host-side figures read while a guest runs: disk transactions/s (as iostat
computes them from /proc/diskstats) and the CPU time of the QEMU process.

All reads go through :class:`~kvmtune.host.root.HostRoot`.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

from kvmtune.host.process import process_cpu_s
from kvmtune.host.root import HostRoot

SECTOR = 512


@dataclass(frozen=True)
class DiskCounters:
    """One /proc/diskstats line (kernel ≥ 4.18 has discards, ≥ 5.5 flushes)."""

    name: str
    reads: int
    sectors_read: int
    writes: int
    sectors_written: int
    discards: int = 0
    flushes: int = 0
    io_ticks_ms: int = 0

    @property
    def ios(self) -> int:
        # iostat's tps: reads + writes + discards completed (flushes are not counted)
        return self.reads + self.writes + self.discards


def parse_diskstats(text: str) -> dict[str, DiskCounters]:
    out: dict[str, DiskCounters] = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) < 14:
            continue
        v = [int(x) for x in f[3:]]
        out[f[2]] = DiskCounters(
            name=f[2],
            reads=v[0],
            sectors_read=v[2],
            writes=v[4],
            sectors_written=v[6],
            io_ticks_ms=v[9],
            discards=v[11] if len(v) > 11 else 0,
            flushes=v[15] if len(v) > 15 else 0,
        )
    return out


def device_of_path(host: HostRoot, path: str) -> str | None:
    """The block device name (as in /proc/diskstats) holding ``path``, or None (tmpfs, overlay…)."""
    st = os.stat(path)
    import stat as _stat

    if _stat.S_ISBLK(st.st_mode):
        major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
    else:
        major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    if major == 0:
        return None
    uevent = host.read_optional(f"/sys/dev/block/{major}:{minor}/uevent") or ""
    for line in uevent.splitlines():
        if line.startswith("DEVNAME="):
            return line.split("=", 1)[1].strip()
    return None


@dataclass
class Snapshot:
    t: float
    disk: DiskCounters | None
    cpu_s: float | None


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
    series: list[Snapshot] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def snap(self) -> Snapshot:
        disk = None
        if self.device:
            text = self.host.read_optional("/proc/diskstats") or ""
            disk = parse_diskstats(text).get(self.device)
        cpu = process_cpu_s(self.host, self.pid) if self.pid else None
        return Snapshot(time.monotonic(), disk, cpu)

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
    """The active I/O scheduler (the bracketed one) of ``device`` or its parent disk."""
    if not device:
        return None
    for dev in (device, device.rstrip("0123456789").rstrip("p") if device[-1].isdigit() else device):
        text = host.read_optional(f"/sys/block/{dev}/queue/scheduler")
        if text:
            for tok in text.split():
                if tok.startswith("["):
                    return tok.strip("[]")
            return text.strip()
    return None
