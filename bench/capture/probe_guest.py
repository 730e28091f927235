"""What bench/capture's scripts share: a probe guest running a disk job (`kvmtune guest run`), its disk throttled
over QMP, and stopping it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

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
def throttled_guest(job: str, iops: int, prefix: str) -> Iterator[tuple[str, Path]]:
    """A probe guest running fio's ``job`` on its disk d0, throttled to ``iops`` once the job runs: (its name, its
    work directory), stopped and removed on leaving."""
    work = Path(tempfile.mkdtemp(prefix=f"kvmtune-{prefix}-"))
    name = f"{prefix[:3]}{os.getpid()}"
    guest = subprocess.Popen([sys.executable, "-m", "kvmtune", "guest", "run", "--workdir", str(work), "--load", "disk",
                              "--name", name, "--job", job], stdout=subprocess.PIPE, text=True)
    try:
        assert guest.stdout is not None
        for line in guest.stdout:
            if "KVMTUNE-JOB-START" in line:
                break
        (qmp_path,) = work.glob(f"run-{name}-*/{name}.qmp")
        q = Qmp(qmp_path, timeout=10)
        try:
            q.execute("block_set_io_throttle", device="d0", bps=0, bps_rd=0, bps_wr=0, iops=iops, iops_rd=0, iops_wr=0)
        finally:
            q.close()
        yield name, work
    finally:
        stop_guest(guest, work)
