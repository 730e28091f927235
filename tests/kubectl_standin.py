"""What the KubeVirt cluster tests share: ``tests/fix/standins/kubectl.py`` first on PATH as ``kubectl``, answering
from a directory of list files and logging each call; never a real cluster, nor a kubectl this machine has."""

from __future__ import annotations

import os
import sys
from pathlib import Path

STANDIN = Path(__file__).resolve().parent / "fix" / "standins" / "kubectl.py"
SRC = Path(__file__).resolve().parents[1] / "src"


def standin_env(tmp: Path, answers: Path, log: Path) -> dict[str, str]:
    """The environment a kvmtune child runs in with the stand-in as its ``kubectl``."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(f'#!/bin/sh\nexec {sys.executable} {STANDIN} "$@"\n')
    kubectl.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(SRC),
            "KVMTUNE_KUBECTL_DIR": str(answers), "KVMTUNE_KUBECTL_LOG": str(log)}
