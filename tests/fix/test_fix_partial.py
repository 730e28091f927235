"""A typical P2V guest (old machine type, a sata data disk) gets its whole plan; a fixer that
cannot finish loses only its own change."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixhelpers import FIXTURE_HOST

from kvmtune.cli import main
from kvmtune.fix.registry import FixCall, XmlFixer, all_fixers

P2V = """<domain type='kvm'>
  <name>p2v01</name>
  <memory unit='MiB'>2048</memory>
  <vcpu>2</vcpu>
  <os>
    <type arch='x86_64' machine='pc-i440fx-2.11'>hvm</type>
  </os>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='none' io='native'/>
      <source file='/var/lib/libvirt/images/p2v01-a.img'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='none' io='native'/>
      <source file='/var/lib/libvirt/images/p2v01-b.img'/>
      <target dev='sda' bus='sata'/>
      <address type='drive' controller='0' bus='0' target='0' unit='0'/>
    </disk>
    <controller type='sata' index='0'/>
  </devices>
</domain>
"""


def fix(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str, Path]:
    xml = tmp_path / "p2v01.xml"
    xml.write_text(P2V)
    code = main(["fix", str(xml), "--root", str(FIXTURE_HOST), "--allow-bus-change", *extra])
    out, err = capsys.readouterr()
    return code, out, err, xml


def test_p2v_guest_gets_the_bus_move_and_queues_on_the_new_disk(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err, xml = fix(tmp_path, capsys)
    assert code == 0, err
    assert "did not remove" not in out + err
    assert "bus sata → virtio, sda → vdb" in out
    assert "queues=2 on vda" in out and "queues=2 on vdb" in out

    assert main(["fix", str(xml), "--root", str(FIXTURE_HOST), "--allow-bus-change", "--apply", "--yes"]) == 0
    capsys.readouterr()
    assert main(["audit", str(xml), "--root", str(FIXTURE_HOST), "--only", "KVM-STO-001,KVM-STO-011", "--no-images",
                 "--fail-on", "info"]) == 0


def test_a_fixer_that_does_not_remove_its_finding_drops_only_its_own_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = all_fixers()["KVM-SEC-001"]

    def claims_but_adds_a_comment(call: FixCall) -> str:
        # edits the document (so there is a change to drop) without adding the rng the rule asks for
        call.doc.set_attr(call.devices(), "data-kvmtune-test", "1")
        return "add <rng> (broken on purpose)"

    monkeypatch.setitem(all_fixers(), "KVM-SEC-001", XmlFixer(real.rule, claims_but_adds_a_comment, real.summary))
    code, out, err, _xml = fix(tmp_path, capsys)
    assert code == 0, err
    assert "KVM-SEC-001" in out and "did not remove the finding" in out and "the rest goes ahead" in out
    assert "data-kvmtune-test" not in out  # its change is gone from the diff
    assert "bus sata → virtio" in out and "queues=2 on vdb" in out  # the rest of the plan is there
