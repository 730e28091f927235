"""Issue 32 item 17: fix plans only what audit reports for the same scope, and CPU changes have their own flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvmtune.cli import main

HOST = Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "rules-default"
# 64 vCPUs: more than the fixture host's CPUs; a generic CPU model (KVM-CPU-001)
BIG = b"""<domain type='kvm'>
  <name>big</name>
  <memory unit='GiB'>4</memory>
  <vcpu>64</vcpu>
  <os><type arch='x86_64' machine='pc-q35-8.2'>hvm</type></os>
  <cpu mode='custom'><model>qemu64</model></cpu>
  <devices><memballoon model='virtio'/></devices>
</domain>
"""


def _fix(tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    dom = tmp_path / "big.xml"
    dom.write_bytes(BIG)
    assert main(["fix", str(dom), "--root", str(HOST), "--only", "KVM-CPU-001,KVM-CPU-002", *flags]) == 0
    assert dom.read_bytes() == BIG  # dry runs
    return capsys.readouterr().out


def _audited(tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> set[str]:
    import json

    out = tmp_path / "a.json"
    main(["audit", str(tmp_path / "big.xml"), "--root", str(HOST), "--only", "KVM-CPU-001,KVM-CPU-002",
          "--format", "json", "-o", str(out), *flags])
    capsys.readouterr()
    return {f["rule"] for f in json.loads(out.read_text())["findings"]}


def test_a_file_not_known_to_run_here_keeps_its_vcpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _fix(tmp_path, capsys, "--allow-cpu-change")
    assert "<vcpu>" not in out.replace("<vcpu>64</vcpu>", "")  # not lowered: audit does not report it either
    assert "KVM-CPU-002" not in _audited(tmp_path, capsys)
    out = _fix(tmp_path, capsys, "--allow-cpu-change", "--assume-this-host")
    assert "-  <vcpu>64</vcpu>" in out  # the same scope as `audit --assume-this-host`, which reports it
    assert "KVM-CPU-002" in _audited(tmp_path, capsys, "--assume-this-host")


def test_cpu_changes_need_their_own_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _fix(tmp_path, capsys, "--allow-bus-change", "--assume-this-host")
    assert "+  <cpu mode='host-model'" not in out and "only with --allow-cpu-change" in out and "Nothing to change." in out
    out = _fix(tmp_path, capsys, "--allow-cpu-change", "--assume-this-host")
    assert "host-model" in out and "only with --allow-cpu-change" not in out
