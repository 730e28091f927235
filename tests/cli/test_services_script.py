"""scripts/services.sh starts libvirtd and virtlogd holding none of its caller's descriptors."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SERVICES = Path(__file__).resolve().parents[2] / "scripts" / "services.sh"


def _pids(name: str) -> list[int]:
    res = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True, check=False)
    return [int(p) for p in res.stdout.split()]


def test_daemons_do_not_hold_the_callers_descriptors(tmp_path: Path) -> None:
    # a caller holding a lock (flock(1) passes its descriptor on): a daemon that kept it would
    # keep the lock for as long as it runs
    subprocess.run(["bash", str(SERVICES), "libvirtd-stop"], check=True)
    deadline = time.monotonic() + 20
    while (_pids("libvirtd") or _pids("virtlogd")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _pids("libvirtd") and not _pids("virtlogd"), "libvirtd did not stop"
    lock = tmp_path / "caller.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        res = subprocess.run(["bash", str(SERVICES), "libvirtd-start"], pass_fds=(fd,), capture_output=True,
                             text=True, timeout=60, check=False)
    finally:
        os.close(fd)
    assert res.returncode == 0, res.stderr
    daemons = _pids("libvirtd") + _pids("virtlogd")
    assert len(daemons) >= 2, daemons
    for pid in daemons:
        held = [os.readlink(f"/proc/{pid}/fd/{n}") for n in os.listdir(f"/proc/{pid}/fd")]
        assert str(lock) not in held, (pid, held)
