"""``kvmtune capture-host``: a captured tree reproduces the host audit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.audit.rule import HostRule, all_rules
from kvmtune.cli import main
from kvmtune.host.root import HostRoot
from kvmtune.qemu.redact import redact_cmdline

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
REPO = Path(__file__).resolve().parents[2]
HOST_RULES = [r for r in all_rules() if issubclass(r, HostRule)]


def findings(root: Path | str) -> list[tuple[str, str | None, str]]:
    ctx = AuditContext(host=HostRoot(str(root)))
    return sorted((f.rule, f.target.device, f.actual) for f in run_rules(ctx, audit_host=True, rules=HOST_RULES))


@pytest.mark.parametrize("scenario", ["rhel6-old", "nvme-modern", "ksm-overcommit", "this-machine"])
def test_recapture_of_a_fixture_gives_the_same_audit(scenario: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    dest = tmp_path / "cap"
    assert main(["capture-host", str(dest), "--root", str(HOSTS / scenario)]) == 0
    assert "captured" in capsys.readouterr().out
    assert findings(dest) == findings(HOSTS / scenario)
    manifest = json.loads((dest / "CAPTURE.json").read_text())
    assert manifest["errors_at_capture"] == []


def test_capture_keeps_only_qemu_and_ksmd_processes(tmp_path: Path) -> None:
    dest = tmp_path / "cap"
    assert main(["capture-host", str(dest), "--root", str(HOSTS / "ksm-overcommit")]) == 0
    pids = sorted(p.name for p in (dest / "proc").iterdir() if p.name.isdigit())
    assert pids == sorted(["58", *[str(p) for p in range(5200, 5212)]])


def test_live_capture_with_the_tool_script(tmp_path: Path) -> None:
    dest = tmp_path / "live"
    r = subprocess.run([sys.executable, str(REPO / "tools" / "capture_host_fixture.py"), str(dest)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (dest / "proc" / "meminfo").is_file() and (dest / "CAPTURE.json").is_file()
    ctx = AuditContext(host=HostRoot(str(dest)))
    run_rules(ctx, audit_host=True, rules=HOST_RULES)
    assert ctx.errors == []


def test_refuses_a_non_empty_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "x").write_text("keep me")
    assert main(["capture-host", str(tmp_path)]) == 2
    assert "not an empty directory" in capsys.readouterr().err
    assert (tmp_path / "x").read_text() == "keep me"


def test_secrets_are_redacted() -> None:
    data = b"qemu-system-x86_64\0-object\0secret,id=s0,data=hunter2,format=raw\0-vnc\0:1,password=on\0"
    out, n = redact_cmdline(data)
    assert b"hunter2" not in out and n == 2 and b"data=REDACTED" in out
