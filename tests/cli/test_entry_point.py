"""Tests drive kvmtune through its normal entry point (``kvmtune.cli.main`` or ``python -m kvmtune``).

The bench tests once replaced ``cli.COMMAND_MODULES`` with the bench commands alone, because the
other subcommands were being written alongside and might not import; every subcommand imports now,
so a test that trims the command list would test a kvmtune nobody runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import kvmtune.cli as cli

REPO = Path(__file__).resolve().parents[2]


def test_no_test_or_bench_script_replaces_the_command_list() -> None:
    here = Path(__file__).resolve()
    offenders = [
        f"{path.relative_to(REPO)}:{n}"
        for top in ("tests", "bench", "tools")
        for path in sorted((REPO / top).rglob("*.py"))
        if path.resolve() != here
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"COMMAND_MODULES\s*=(?!=)|setattr\([^)]*COMMAND_MODULES", line)  # replaced, not read
    ]
    assert offenders == [], offenders


def test_every_command_module_registers_through_the_real_parser() -> None:
    # what the trimmed lists guarded against: one subcommand failing to import breaks every command
    proc = subprocess.run([sys.executable, "-m", "kvmtune", "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    listed = re.findall(r"^    (\S+)", proc.stdout, flags=re.M)
    assert len(listed) >= len(cli.COMMAND_MODULES)  # every module registers at least one command
    for name in ("guest", "bench", "results", "compare", "report", "net"):  # the ones the bench tests drive
        assert name in listed, (name, listed)
