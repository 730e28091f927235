"""The readers (domain/, qemu/) stay small: no function above cyclomatic complexity 15 (ruff's C901)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kvmtune

SRC = Path(kvmtune.__file__).resolve().parent
LIMIT = 15


def _ruff() -> str:
    beside = Path(sys.executable).parent / "ruff"
    found = str(beside) if beside.exists() else shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed")
    return found


def test_no_reader_function_above_complexity_15() -> None:
    proc = subprocess.run(
        [_ruff(), "check", "--isolated", "--ignore-noqa", "--select", "C901", "--config",
         f"lint.mccabe.max-complexity={LIMIT}", "--output-format", "concise", "--no-cache",
         str(SRC / "domain"), str(SRC / "qemu")],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
