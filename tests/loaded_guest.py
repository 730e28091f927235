"""What the capture and replay integration tests share: a probe guest running a disk job (`kvmtune guest run
--load disk --job …`), its disk throttled over QMP once the job runs, interrupted as a user would on leaving."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from kvmtune.qemu.qmp import Qmp

JOB = "rw=randrw rwmixread=70 bs=16k iodepth=8"


@contextlib.contextmanager
def throttled_probe(work: Path, name: str, seconds: int, iops: int = 600, job: str = JOB) -> Iterator[None]:
    """A probe guest named ``name`` in ``work`` running fio's ``job`` for at most ``seconds``, its disk d0 throttled
    to ``iops`` (fio's requests then wait in QEMU's throttle, in sight of the trace events)."""
    proc = subprocess.Popen([sys.executable, "-m", "kvmtune", "guest", "run", "--workdir", str(work), "--load", "disk",
                             "--name", name, "--seconds", str(seconds), "--job", job],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "console: KVMTUNE-JOB-START" in line:
                break
        else:
            raise AssertionError(f"guest run ended early: {proc.wait()} {proc.stderr.read() if proc.stderr else ''}")
        (qmp_path,) = work.glob(f"run-{name}-*/{name}.qmp")
        q = Qmp(qmp_path, timeout=10)
        try:
            q.execute("block_set_io_throttle", device="d0", bps=0, bps_rd=0, bps_wr=0, iops=iops, iops_rd=0, iops_wr=0)
        finally:
            q.close()
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
