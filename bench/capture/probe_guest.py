"""What bench/capture's scripts share: a probe guest running a disk job (`kvmtune guest run`), its disk throttled
over QMP, and stopping it; capturing it by trace; kvmtune run as a child; a scratch directory."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from kvmtune.qemu.qmp import Qmp


def stop_guest(guest: subprocess.Popen[str], work: Path) -> None:
    """Interrupt the guest run as a user would, then remove its work directory."""
    guest.send_signal(signal.SIGINT)
    try:  # its stdout drained, so that its last lines never block it
        guest.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        guest.kill()
        guest.communicate()
    shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def disk_guest(work: Path, name: str, job: str, extra: Sequence[str] = ()) -> Iterator[Path]:
    """``kvmtune guest run --load disk --job JOB`` named ``name`` in ``work`` (``extra``: more of its options), once
    its job runs: its QMP socket's path; stopped and ``work`` removed on leaving."""
    guest = subprocess.Popen([sys.executable, "-m", "kvmtune", "guest", "run", "--workdir", str(work), "--load", "disk",
                              "--name", name, "--job", job, *extra], stdout=subprocess.PIPE, text=True)
    try:
        assert guest.stdout is not None
        for line in guest.stdout:
            if "KVMTUNE-JOB-START" in line:
                break
        (qmp_path,) = work.glob(f"run-{name}-*/{name}.qmp")
        yield qmp_path
    finally:
        stop_guest(guest, work)


@contextlib.contextmanager
def throttled_guest(job: str, iops: int, prefix: str) -> Iterator[tuple[str, Path]]:
    """A probe guest running fio's ``job`` on its disk d0, throttled to ``iops`` once the job runs: (its name, its
    work directory), stopped and removed on leaving."""
    work = Path(tempfile.mkdtemp(prefix=f"kvmtune-{prefix}-"))
    name = f"{prefix[:3]}{os.getpid()}"
    with disk_guest(work, name, job) as qmp_path:
        q = Qmp(qmp_path, timeout=10)
        try:
            q.execute("block_set_io_throttle", device="d0", bps=0, bps_rd=0, bps_wr=0, iops=iops, iops_rd=0, iops_wr=0)
        finally:
            q.close()
        yield name, work


def kvmtune(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """``kvmtune ARGS`` run by this Python in a child, its output captured."""
    return subprocess.run([sys.executable, "-m", "kvmtune", *args], capture_output=True, text=True, timeout=timeout)


def capture_by_trace(job: str, iops: int, prefix: str, seconds: float, out: Path) -> dict[str, Any]:
    """The probe guest running ``job`` throttled to ``iops`` (:func:`throttled_guest`), captured ``seconds`` by trace
    into ``out`` (``kvmtune capture --source trace``), then stopped: the captured disk's figures."""
    with throttled_guest(job, iops, prefix) as (name, work):
        done = kvmtune("capture", name, "--no-libvirt", "--workdir", str(work), "--seconds", str(seconds),
                       "--source", "trace", "-o", str(out), timeout=seconds + 60)
        if done.returncode != 0:
            raise SystemExit(f"capture failed: {done.stderr.strip()}")
    disk: dict[str, Any] = json.loads(out.read_text())["disks"][0]
    return disk


@contextlib.contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """A scratch directory ``<prefix><pid>-…`` in the temporary directory, removed on leaving."""
    tmp = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
