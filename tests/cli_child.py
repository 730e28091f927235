"""What the tests that run kvmtune as a child with a home of its own share (a settings-free environment)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def kvmtune(*argv: str, home: Path) -> subprocess.CompletedProcess[str]:
    """``kvmtune ARGV`` as a child of this Python, on this checkout's ``src``, with ``home`` as its HOME (its data and
    cache directories inside it) and no settings file named by the environment; output captured, 120 s at most."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HOME": str(home), "XDG_DATA_HOME": str(home / "data"),
           "XDG_CACHE_HOME": str(home / "cache")}
    env.pop("KVMTUNE_CONFIG", None)
    env.pop("XDG_CONFIG_HOME", None)
    return subprocess.run([sys.executable, "-m", "kvmtune", *argv], capture_output=True, text=True, env=env,
                          timeout=120, check=False)
