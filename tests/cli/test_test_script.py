"""scripts/test.sh --fast, the development loop: ruff, mypy and the unit tier, never install.sh.

Each test runs the real script in a copy of the repository's layout whose install.sh and .venv tools
are stand-ins that record how they were called."""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "test.sh"


def _tool(path: Path, body: str) -> None:
    path.write_text("#!/usr/bin/env bash\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _layout(tmp_path: Path, *, venv: bool, failing: str = "") -> Path:
    """A checkout: scripts/test.sh (the real one), an install.sh that only leaves a mark, and maybe a .venv."""
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy2(SCRIPT, root / "scripts" / "test.sh")
    _tool(root / "scripts" / "install.sh", f'touch "{tmp_path}/install-ran"')
    (root / "netload").mkdir()
    (root / "netload" / "Makefile").write_text("test:\n\ttouch ../go-ran\n")
    if venv:
        bin_dir = root / ".venv" / "bin"
        bin_dir.mkdir(parents=True)
        for name in ("python", "ruff", "mypy", "pytest"):
            code = 1 if name == failing else 0
            _tool(bin_dir / name, f'printf "%s|%s\\n" "{name} $*" "$PYTHONPATH" >> "{tmp_path}/calls"; exit {code}')
    return root


def _run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(root / "scripts" / "test.sh"), *args], capture_output=True, text=True, timeout=60)


def test_fast_runs_ruff_mypy_and_the_unit_tier_without_installing(tmp_path: Path) -> None:
    root = _layout(tmp_path, venv=True)
    proc = _run(root, "--fast")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not (tmp_path / "install-ran").exists()
    assert not (root / "go-ran").exists()
    calls = [line.split("|") for line in (tmp_path / "calls").read_text().splitlines()]
    assert [c[0].strip() for c in calls] == [
        "ruff check src tests bench tools",
        "mypy",
        "pytest -q -p no:cacheprovider -m not integration tests",
    ]
    # this checkout's src comes first, even with a .venv shared between worktrees
    assert all(c[1].split(":")[0] == str(root / "src") for c in calls)
    assert "== " in proc.stdout and " s: .venv/bin/pytest" in proc.stdout


def test_fast_without_a_venv_is_one_line_and_installs_nothing(tmp_path: Path) -> None:
    root = _layout(tmp_path, venv=False)
    proc = _run(root, "--fast")
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and ".venv/bin/" in lines[0] and "scripts/install.sh" in lines[0], proc.stderr
    assert not (tmp_path / "install-ran").exists()
    assert proc.stdout == ""


def test_fast_fails_when_a_step_fails_and_still_runs_the_others(tmp_path: Path) -> None:
    root = _layout(tmp_path, venv=True, failing="mypy")
    proc = _run(root, "--fast")
    assert proc.returncode == 1 and "test.sh: FAILED" in proc.stderr
    assert len((tmp_path / "calls").read_text().splitlines()) == 3


def test_unknown_option_is_refused(tmp_path: Path) -> None:
    root = _layout(tmp_path, venv=True)
    proc = _run(root, "--bogus")
    assert proc.returncode == 2 and "usage:" in proc.stderr
    assert not (tmp_path / "install-ran").exists() and not (tmp_path / "calls").exists()


def _full_calls(tmp_path: Path) -> list[str]:
    return [line.split("|")[0].strip() for line in (tmp_path / "calls").read_text().splitlines()]


UNIT = "pytest -q -p no:cacheprovider -p no:randomly -m not integration and not guest_tier tests"
INTEGRATION = "pytest -q -p no:cacheprovider -p no:randomly -m integration and not guest_tier tests"
GUEST_TIER = "pytest -q -p no:cacheprovider -p no:randomly -m guest_tier tests/verify"


def test_full_run_holds_the_guest_tier_to_its_own_step(tmp_path: Path) -> None:
    """Without --fast: install.sh; lane A the integration tests, then the guest tier alone (held to 180 s); lane B,
    beside it, the unit tier and Go. Every test runs once: the three marker expressions cover the suite."""
    root = _layout(tmp_path, venv=True)
    proc = _run(root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "install-ran").exists() and (root / "go-ran").exists()
    calls = _full_calls(tmp_path)
    assert calls[:2] == ["ruff check src tests bench tools", "mypy"]
    assert sorted(calls[2:]) == sorted([UNIT, INTEGRATION, GUEST_TIER])
    # lane A's order: the integration tests, then the guest tier
    assert calls.index(INTEGRATION) < calls.index(GUEST_TIER)
    assert "== timeout --kill-after=10 180 .venv/bin/pytest" in proc.stdout
    # lane B's output comes after lane A's, in one piece, with its own step times
    lane_b = proc.stdout.index("== lane B")
    assert proc.stdout.index("s: make") > lane_b > proc.stdout.index("s: timeout")
    assert "s: both lanes" in proc.stdout


def test_full_run_fails_when_only_lane_b_fails(tmp_path: Path) -> None:
    """A unit-tier failure in the background lane fails the run, after lane A has finished."""
    root = _layout(tmp_path, venv=True)
    (root / "netload" / "Makefile").write_text("test:\n\ttouch ../go-ran\n\tfalse\n")
    proc = _run(root)
    assert proc.returncode == 1 and "test.sh: FAILED" in proc.stderr
    assert INTEGRATION in _full_calls(tmp_path) and GUEST_TIER in _full_calls(tmp_path)


def test_full_run_runs_lane_b_at_a_lower_priority(tmp_path: Path) -> None:
    root = _layout(tmp_path, venv=True)
    bin_dir = root / ".venv" / "bin"
    _tool(bin_dir / "pytest", f'printf "%s|%s\\n" "pytest $*" "$(nice)" >> "{tmp_path}/calls"')
    proc = _run(root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    niceness = {c.split("|")[0].strip(): int(c.split("|")[1]) for c in
                (tmp_path / "calls").read_text().splitlines() if c.startswith("pytest")}
    base = int(subprocess.run(["nice"], capture_output=True, text=True, check=True).stdout)
    # lane B at the lowest priority, whatever the caller's (this test itself may run in a niced lane B)
    assert niceness[UNIT] == 19
    assert niceness[INTEGRATION] == base and niceness[GUEST_TIER] == base
