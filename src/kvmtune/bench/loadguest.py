"""``kvmtune guest run``: the probe guest with a steady load, to watch with ``top``, ``why`` and ``sample``.

It is started as libvirt and Proxmox VE start QEMU: ``-name N,debug-threads=on`` (named vCPU, I/O and worker
threads) and a QMP socket, so every live source has what it reads. The load:

- ``cpu``: one busy loop per vCPU;
- ``disk``: fio random reads and writes on a scratch raw image (deleted afterwards), virtio-blk, cache=none.

The accelerator is the one ``kvmtune guest accel`` finds: under TCG every number the guest shows is an
emulation number, and ``why`` says so.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kvmtune.bench.guest import ProbeGuest
from kvmtune.bench.qemu import Disk, GuestRun, VmSpec
from kvmtune.errors import KvmtuneError
from kvmtune.runner import Runner

LOADS = ("cpu", "disk")  # net: not yet (the probe guest has no packet generator busybox drives faster than 1/s)


def _insmod(guest: ProbeGuest) -> str:
    return f"for m in {' '.join(guest.module_paths)}; do insmod /lib/modules/$m 2>/dev/null; done\n"


def load_job(guest: ProbeGuest, load: str, smp: int) -> str:
    """The guest's job script for ``load``."""
    if load == "cpu":
        return "".join("while :; do :; done &\n" for _ in range(smp)) + "wait\n"
    if load == "disk":
        return (_insmod(guest) + "while [ ! -b /dev/vda ]; do sleep 0.1; done\n"
                "fio --name=load --filename=/dev/vda --rw=randrw --bs=4k --direct=1 --ioengine=psync "
                "--time_based --runtime=86400 >/dev/null\n")
    raise KvmtuneError(f"--load {load}: one of {', '.join(LOADS)}")


@dataclass
class LoadGuest:
    """One probe guest under load; ``start()`` then ``wait(seconds)``, ``close()`` always."""

    guest: ProbeGuest
    load: str
    name: str
    accel: str
    workdir: Path
    runner: Runner
    pin: str | None = None
    smp: int = 1

    def __post_init__(self) -> None:
        self.rundir = self.workdir / f"run-{self.name}-{os.getpid()}"
        self.image = self.rundir / "disk.raw"
        self.run: GuestRun | None = None

    def _spec(self) -> VmSpec:
        extra = ["-name", f"{self.name},debug-threads=on"]
        disks: list[Disk] = []
        if self.load == "disk":
            self.rundir.mkdir(parents=True, exist_ok=True)
            with open(self.image, "wb") as fh:
                fh.truncate(1 << 30)
            disks = [Disk(str(self.image), "raw", "virtio-blk", "none", "threads")]
        job = load_job(self.guest, self.load, self.smp)
        return VmSpec(guest=self.guest, accel=self.accel, smp=self.smp, job=job,
                      disks=disks, extra_args=extra, wrapper=["taskset", "-c", self.pin] if self.pin else [])

    def start(self) -> int:
        self.run = GuestRun(self._spec(), self.rundir, self.runner, name=self.name)
        return self.run.start().pid

    def wait(self, seconds: float | None) -> Iterator[str]:
        """Yield console lines as they come until ``seconds`` pass (None: until QEMU ends or Ctrl-C)."""
        assert self.run is not None and self.run.proc is not None
        deadline = None if seconds is None else time.monotonic() + seconds
        pos = 0
        while self.run.proc.poll() is None and (deadline is None or time.monotonic() < deadline):
            with contextlib.suppress(OSError), open(self.run.serial, "rb") as fh:
                fh.seek(pos)
                chunk = fh.read()
                pos += len(chunk)
                yield from (line for line in chunk.decode("utf-8", "replace").splitlines() if line.startswith("KVMTUNE-"))
            time.sleep(0.2)
        if self.run.proc.poll() is not None:
            err = self.run.stderr_path.read_bytes()[-400:].decode("utf-8", "replace").strip().splitlines()
            raise KvmtuneError(f"QEMU exited {self.run.proc.returncode}: {err[-1] if err else 'no error output'}")

    def close(self) -> None:
        if self.run is not None:
            self.run.close()
        with contextlib.suppress(OSError):
            self.image.unlink()
        with contextlib.suppress(OSError):
            self.rundir.rmdir()
