"""Issue 43 item 5, through the CLI: an input nested too deeply or too large to read is one line naming the file
and exit 2 (an input error), never a traceback whose exit 1 CI reads as "findings at --fail-on"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kvmtune.audit.waivers import MAX_BASELINE_BYTES

REPO = Path(__file__).resolve().parents[2]
LEGACY = REPO / "src" / "kvmtune" / "examples" / "web01-legacy.xml"


def kvmtune(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop("KVMTUNE_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "kvmtune", *argv], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


def one_line(done: subprocess.CompletedProcess[str], path: Path, problem: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [f"kvmtune: {path}: {problem}"], done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_a_200000_deep_toml_list_in_the_settings_file_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "kvmtune.toml"
    config.write_text("fail_on = \"high\"\nskip = " + "[" * 200_000 + "]" * 200_000 + "\n")
    config.chmod(0o644)
    assert config.stat().st_size < 1024 * 1024  # within the settings file's size cap: it is read, then parsed
    one_line(kvmtune("audit", "--config", str(config), "--fail-on", "high", str(LEGACY)), config,
             "TOML nested too deeply to read")


def test_a_100000_deep_baseline_is_one_line(tmp_path: Path) -> None:
    baseline = tmp_path / "baseline.json"
    baseline.write_text('{"schema_version": 1, "findings": ' + "[" * 100_000 + "]" * 100_000 + "}")
    one_line(kvmtune("audit", "--no-config", "--fail-on", "high", "--new-since", str(baseline), str(LEGACY)),
             baseline, "JSON nested too deeply to read; not a kvmtune audit report")


def test_a_baseline_over_the_cap_is_refused_unread(tmp_path: Path) -> None:
    baseline = tmp_path / "huge.json"
    with open(baseline, "wb") as fh:  # sparse: its size is what is refused, before a byte is read
        fh.truncate(MAX_BASELINE_BYTES + 1)
    one_line(kvmtune("audit", "--no-config", "--fail-on", "high", "--new-since", str(baseline), str(LEGACY)),
             baseline, "larger than 256 MiB (a baseline report), refused")
    # a 10,000-domain report is 148 MiB (docs/settings.md): the cap is near it, not 512 MiB
    assert 160 * 2**20 < MAX_BASELINE_BYTES <= 256 * 2**20


def test_a_deep_json_option_in_a_qemu_command_line_is_one_line(tmp_path: Path) -> None:
    """Another user's QEMU (``audit --running``) or a command-line file may carry it in ``-blockdev``."""
    line = tmp_path / "vm.cmdline"
    line.write_text("qemu-system-x86_64 -name vm -blockdev '{\"driver\": " + "[" * 100_000 + "]" * 100_000 + "}'\n")
    one_line(kvmtune("audit", "--no-config", "--fail-on", "high", "--qemu-cmdline", str(line)), line,
             "JSON option value nested too deeply to read")


def test_a_deep_fleet_report_is_one_line(tmp_path: Path) -> None:
    report = tmp_path / "hv1.json"
    report.write_text(json.dumps({"schema_version": 1})[:-1] + ', "findings": ' + "[" * 100_000 + "]" * 100_000 + "}")
    done = kvmtune("report", str(report))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "JSON nested too deeply to read" in done.stderr and str(report) in done.stderr
    assert "Traceback" not in done.stderr


def test_a_deep_json_drive_file_in_a_qemu_command_line_is_one_line(tmp_path: Path) -> None:
    """``-drive file=json:...``: the option reader leaves the file= value as text, the block reader decodes it."""
    line = tmp_path / "vm.cmdline"
    line.write_text("qemu-system-x86_64 -name vm -drive 'file=json:" + "[" * 100_000 + ",if=virtio'\n")
    one_line(kvmtune("audit", "--no-config", "--fail-on", "high", "--qemu-cmdline", str(line)), line,
             "JSON option value nested too deeply to read")


def test_another_users_qemu_with_a_deep_json_drive_costs_that_process_not_the_audit(tmp_path: Path) -> None:
    """``audit --running``: any user can start a QEMU whose ``-drive file=json:`` is nested past the JSON reader's
    recursion limit (a -blockdev nested just short of it reaches a reader further down the stack); it was a
    RecursionError that ended the audit of every guest ("nothing judged")."""
    good, bad = tmp_path / "proc" / "100", tmp_path / "proc" / "200"
    good.mkdir(parents=True)
    bad.mkdir()
    (good / "cmdline").write_bytes(b"qemu-system-x86_64\0-name\0guest=good\0-m\0512\0")
    (bad / "cmdline").write_bytes(b"qemu-system-x86_64\0-name\0guest=bad\0-drive\0file=json:" + b"[" * 300_000
                                  + b",if=virtio\0")
    done = kvmtune("audit", "--no-config", "--running", "--root", str(tmp_path), "--format", "json")
    assert done.stderr.splitlines() == ["kvmtune: /proc/200/cmdline: JSON option value nested too deeply to read"], \
        done.stderr
    report = json.loads(done.stdout)
    assert report["errors"] == ["/proc/200/cmdline: JSON option value nested too deeply to read"]
    assert {f["target"]["domain"] for f in report["findings"]} == {"good"}  # the other guest is still audited
    assert "Traceback" not in done.stderr
