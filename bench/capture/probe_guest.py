"""What bench/capture's scripts share: stopping the probe guest they started (`kvmtune guest run`)."""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path


def stop_guest(guest: subprocess.Popen[str], work: Path) -> None:
    """Interrupt the guest run as a user would, then remove its work directory."""
    guest.send_signal(signal.SIGINT)
    try:  # its stdout drained, so that its last lines never block it
        guest.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        guest.kill()
        guest.communicate()
    shutil.rmtree(work, ignore_errors=True)
