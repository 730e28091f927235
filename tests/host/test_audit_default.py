"""The audit command with the host: --host, and the default audit (no input named) including it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvmtune.cli import main

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:  # type: ignore[type-arg]
    code = main(["audit", "--format", "json", *args])
    return code, json.loads(capsys.readouterr().out)


def test_default_audit_of_a_captured_root_includes_host_and_its_guests(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = run(["--root", str(HOSTS / "ksm-overcommit")], capsys)
    rules = {f["rule"] for f in doc["findings"]}
    assert "KVM-HST-020" in rules  # host
    assert any(f["target"]["domain"] == "web03" for f in doc["findings"])  # a running guest from its /proc
    assert doc["looked_at"][0].startswith("host ksm-overcommit (captured tree")
    assert code == 0


def test_host_only(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = run(["--host", "--root", str(HOSTS / "rhel6-old"), "--fail-on", "critical"], capsys)
    assert code == 1  # nobarrier is critical
    assert {f["rule"][:7] for f in doc["findings"]} == {"KVM-HST"}
    assert all(f["target"]["host"] == "rhel6-old" for f in doc["findings"])


def test_domain_files_do_not_pull_in_the_host(capsys: pytest.CaptureFixture[str]) -> None:
    _, doc = run(["--examples", "--root", str(HOSTS / "rhel6-old")], capsys)
    assert not any(f["rule"].startswith("KVM-HST") for f in doc["findings"])
    _, doc = run(["--examples", "--host", "--root", str(HOSTS / "rhel6-old")], capsys)
    assert any(f["rule"].startswith("KVM-HST") for f in doc["findings"])


def test_text_report_names_the_host(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "--host", "--root", str(HOSTS / "nvme-modern")]) == 0
    out = capsys.readouterr().out
    assert "host nvme-modern" in out and "0 findings" in out and "host audited" in out


def test_default_audit_without_guests_audits_only_this_host(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An empty host is answered about itself: "0 guests", the host's findings, no example domains."""
    root = tmp_path / "host"
    (root / "proc").mkdir(parents=True)  # no /proc/<pid>: no running guest
    (root / "proc" / "meminfo").write_text("MemTotal:       16384000 kB\n")
    code, doc = run(["--root", str(root)], capsys)
    assert any(line.startswith("0 guests on ") for line in doc["looked_at"])
    assert not any("example" in line for line in doc["looked_at"])
    assert not any(line.startswith("libvirt ") for line in doc["looked_at"])  # not this machine's libvirt
    assert doc["findings"] and all(f["target"]["domain"] is None for f in doc["findings"])
    assert code == 0

    assert main(["audit", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "0 guest(s) audited, host audited" in out
    assert "web01-legacy" not in out
    assert "hint: no guests to audit; 'kvmtune audit --examples'" in out


def test_examples_only_when_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, doc = run(["--examples", "--root", str(HOSTS / "rhel6-old")], capsys)
    assert any(f["target"]["domain"] == "web01-legacy" for f in doc["findings"])


def test_audit_of_a_captured_host_without_guests_stays_about_that_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    captured = tmp_path / "captured"
    assert main(["capture-host", str(captured), "--root", str(HOSTS / "nvme-modern")]) == 0
    hint = capsys.readouterr().out
    assert f"kvmtune audit --root {captured}" in hint
    for pid_dir in (captured / "proc").iterdir():  # drop the captured QEMU processes: a host without guests
        if pid_dir.name.isdigit():
            shutil.rmtree(pid_dir)
    code, doc = run(["--root", str(captured)], capsys)
    assert any(line.startswith("0 guests on host ") for line in doc["looked_at"])
    assert all(f["target"]["domain"] is None for f in doc["findings"])
    assert code == 0
