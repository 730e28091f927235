"""Start-up imports only what the command given needs (issue 38, goal 3; bench/startup/run.py times it).

`import kvmtune.cli` pulls in no benchmark, fix, live or verify module, and `kvmtune --version` and
`kvmtune --help` import no subcommand module: the subcommands are listed from ``COMMAND_TABLE`` and a
command's module is imported when it is the one that runs. Each check is a fresh interpreter: what the
test process itself has imported says nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("kvmtune.bench", "kvmtune.lab", "kvmtune.fix", "kvmtune.live", "kvmtune.verify")
ALWAYS = {"kvmtune.cli", "kvmtune.cli.command"}  # the entry point and the one command shape


# What the console script does ([project.scripts] kvmtune = "kvmtune.cli:main"), then the modules loaded by then.
DRIVER = """
import sys
out, sys.argv = sys.argv[1], ["kvmtune", *sys.argv[2:]]
from kvmtune.cli import main
try:
    code = main()
except SystemExit as exc:  # --version and --help exit from inside argparse
    code = exc.code
with open(out, "w") as fh:
    fh.write("\\n".join(sorted(sys.modules)))
sys.exit(code)
"""


def loaded_by(tmp_path: Path, *argv: str) -> tuple[str, list[str]]:
    """The standard output of ``kvmtune ARGV`` in a fresh interpreter, and every module loaded when it ends."""
    out = tmp_path / "modules.txt"
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(out), *argv], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")}, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, out.read_text(encoding="utf-8").split()


def heavy(names: list[str]) -> list[str]:
    return [n for n in names if any(n == h or n.startswith(h + ".") for h in HEAVY)]


def commands(names: list[str]) -> list[str]:
    return [n for n in names if n.startswith("kvmtune.cli.") and n not in ALWAYS]


def test_the_checks_see_what_they_look_for() -> None:
    names = ["kvmtune", "kvmtune.cli", "kvmtune.cli.command", "kvmtune.cli.audit", "kvmtune.lab.store",
             "kvmtune.fix", "kvmtune.verifyplan", "kvmtune.audit.verifyplan", "kvmtune.livex"]
    assert heavy(names) == ["kvmtune.lab.store", "kvmtune.fix"]
    assert commands(names) == ["kvmtune.cli.audit"]


def test_import_cli_pulls_in_no_bench_lab_fix_live_or_verify_module() -> None:
    proc = subprocess.run([sys.executable, "-c", "import sys, kvmtune.cli; print('\\n'.join(sorted(sys.modules)))"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO / "src")},
                          timeout=120, check=True)
    loaded = proc.stdout.split()
    assert "kvmtune.cli" in loaded
    assert heavy(loaded) == []
    assert commands(loaded) == []


def test_version_imports_no_subcommand_module(tmp_path: Path) -> None:
    out, loaded = loaded_by(tmp_path, "--version")
    assert out.startswith("kvmtune ")
    assert "kvmtune.cli" in loaded
    assert commands(loaded) == []
    assert heavy(loaded) == []


def test_help_lists_every_command_and_imports_none(tmp_path: Path) -> None:
    out, loaded = loaded_by(tmp_path, "--help")
    assert "    audit " in out and "    config " in out
    assert commands(loaded) == []
    assert heavy(loaded) == []


def test_a_command_imports_its_own_module_and_no_other(tmp_path: Path) -> None:
    out, loaded = loaded_by(tmp_path, "rules", "list")
    assert "KVM-CPU-001" in out
    assert commands(loaded) == ["kvmtune.cli.rules"]
    assert heavy(loaded) == []
