"""Saved, already-booted probe guests: boot once, restore for every configuration.

Under TCG a boot costs 3-5 s, more than the workloads of a short configuration.
So the probe guest is booted once per guest-visible disk shape (bus, size,
whether the disk reports a volatile write cache, memory, vCPUs) with a sparse
placeholder image, brought to the point where the disk is probed, paused and
saved with QMP ``migrate`` to a file. A configuration then starts QEMU with
``-incoming`` from that file and *its own* ``-drive`` (format, cache, aio and
image are host-side properties the migration does not carry); the new QEMU serves
the same job through fw_cfg (the guest cached the fw_cfg file size when it booted)
and gives the guest's agent its channel, through which the host then drives it
as it drives a booted one.

What the guest sees is the same as after a cold boot with that disk: the same
device, the same capacity, the same write-cache flag, a disk that reads as zeros
(the placeholder and a fresh image both do). Snapshots live in the work
directory, keyed by everything above plus the probe guest and the QEMU version,
and the least recently used beyond ``MAX_SNAPSHOTS`` are deleted.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvmtune.errors import KvmtuneError
from kvmtune.lab.guest import ProbeGuest
from kvmtune.lab.probe.agent import ProbeAgent
from kvmtune.lab.qemu import BUS_GUEST_DEV, FAST_BOOT_ARGS, Disk, GuestRun, VmSpec, qemu_version
from kvmtune.lab.storage import fio as fiomod
from kvmtune.lab.workdir import free_bytes
from kvmtune.runner import Runner

SNAPSHOT_VERSION = "2"  # 2: saved with the guest agent running, driven through it after the restore
MAX_SNAPSHOTS = 6


def reports_write_cache(cache: str) -> bool:
    """Whether QEMU tells the guest the disk has a volatile write cache for this cache mode."""
    return cache not in ("writethrough", "directsync")


@dataclass
class SnapshotCache:
    dir: Path
    runner: Runner
    failures: dict[str, str] = field(default_factory=dict)
    made: int = 0
    _qemu: str | None = None

    def key(self, guest: ProbeGuest, accel: str, memory_mb: int, smp: int, bus: str, disk_mib: int, wce: bool,
            modules: list[str]) -> str:
        if self._qemu is None:
            self._qemu = qemu_version(self.runner)
        h = hashlib.sha256()
        for part in (SNAPSHOT_VERSION, guest.key, accel, memory_mb, smp, bus, disk_mib, wce, FAST_BOOT_ARGS,
                     self._qemu, *modules):
            h.update(f"{part}\n".encode())
        return h.hexdigest()[:24]

    @staticmethod
    def job(bus: str, disk_mib: int, modules: list[str]) -> str:
        """The job a saved guest ran, which its restoring QEMU must serve again (same fw_cfg file)."""
        return fiomod.wait_job(fiomod.GuestJob(BUS_GUEST_DEV[bus], modules, [], 0.0, disk_mib))

    def ensure(
        self, guest: ProbeGuest, accel: str, memory_mb: int, smp: int, bus: str, disk_mib: int, cache: str,
        modules: list[str], boot_timeout: float = 60.0,
    ) -> Path | None:
        """The saved guest for this disk shape, making it if needed; None when that is not possible."""
        wce = reports_write_cache(cache)
        key = self.key(guest, accel, memory_mb, smp, bus, disk_mib, wce, modules)
        if key in self.failures:
            return None
        state = self.dir / f"{key}.state"
        if state.is_file():
            with contextlib.suppress(OSError):
                os.utime(state)
            return state
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            if free_bytes(self.dir) < (memory_mb + 256) << 20:
                raise KvmtuneError(f"{self.dir}: not enough free space to save a {memory_mb} MiB guest")
            self._make(state, guest, accel, memory_mb, smp, bus, disk_mib, wce, modules, boot_timeout)
        except (KvmtuneError, OSError) as exc:
            self.failures[key] = str(exc)
            return None
        self.made += 1
        self._prune(keep=state)
        return state

    def _make(
        self, state: Path, guest: ProbeGuest, accel: str, memory_mb: int, smp: int, bus: str, disk_mib: int,
        wce: bool, modules: list[str], boot_timeout: float,
    ) -> None:
        placeholder = state.with_suffix(f".placeholder{os.getpid()}.raw")
        with open(placeholder, "wb") as fh:
            fh.truncate(disk_mib << 20)
        sock = self.dir / "run" / f"qga-snap{os.getpid()}.sock"
        try:
            spec = VmSpec(
                guest=guest, accel=accel, memory_mb=memory_mb, smp=smp, job=self.job(bus, disk_mib, modules),
                disks=[Disk(str(placeholder), "raw", bus, "writeback" if wce else "writethrough", "threads")],
                agent_socket=sock,
            )
            with GuestRun(spec, self.dir / "run", self.runner, name=f"snap{os.getpid()}") as vm:
                vm.start()
                deadline = time.monotonic() + boot_timeout
                while True:
                    text = vm.serial.read_text(errors="replace")
                    if fiomod.READY in text:
                        break
                    fatal = next((ln for ln in text.splitlines() if ln.startswith("KVMTUNE-FATAL")), None)
                    if fatal or (vm.proc is not None and vm.proc.poll() is not None):
                        raise KvmtuneError(f"the guest to be saved stopped: {fatal or 'QEMU exited'}")
                    if time.monotonic() > deadline:
                        raise KvmtuneError(f"the guest to be saved did not come up within {boot_timeout:.0f}s")
                    time.sleep(0.02)
                agent = ProbeAgent(vm, sock, "to be saved")  # saved only once its agent answers
                agent.connect(deadline, boot_timeout)
                agent.close()
                vm.save_state(state)
        finally:
            placeholder.unlink(missing_ok=True)
            sock.unlink(missing_ok=True)

    def _prune(self, keep: Path) -> None:
        states = sorted(self.dir.glob("*.state"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in states[MAX_SNAPSHOTS:]:
            if old != keep:
                old.unlink(missing_ok=True)
