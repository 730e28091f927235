"""Host-relative checks run only for guests known to run on the audited host."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvmtune.audit.collect import is_local_uri
from kvmtune.cli import main

FIXTURE_HOST = Path(__file__).parent.parent / "fixtures" / "hosts" / "rules-default"
BIG = """<domain type='kvm'>
  <name>big</name>
  <memory unit='GiB'>4</memory>
  <vcpu>64</vcpu>
  <os><type arch='x86_64' machine='pc-q35-8.2'>hvm</type></os>
  <cpu mode='host-passthrough'/>
</domain>
"""


def audit(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict:  # type: ignore[type-arg]
    code = main(["audit", "--root", str(FIXTURE_HOST), "--format", "json", "--only", "KVM-CPU-002", *args])
    assert code == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_a_domain_file_is_not_judged_against_this_hosts_cpus(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    xml = tmp_path / "big.xml"
    xml.write_text(BIG)
    doc = audit([str(xml)], capsys)
    assert doc["findings"] == []
    [line] = [s for s in doc["looked_at"] if "not known to run on this host" in s]
    assert line.startswith("1 guest(s)") and "--assume-this-host" in line
    doc = audit([str(xml), "--assume-this-host"], capsys)
    assert [f["rule"] for f in doc["findings"]] == ["KVM-CPU-002"]
    assert not any("not known to run on this host" in s for s in doc["looked_at"])


@pytest.mark.parametrize(
    ("uri", "local"),
    [("qemu:///system", True), ("qemu:///session", True), ("qemu+unix:///system", True),
     ("qemu+ssh://root@kvm2/system", False), ("qemu://kvm2/system", False), ("qemu+tcp://10.0.0.2/system", False),
     ("test:///default", True), ("nonsense", False)],
)
def test_which_libvirt_uris_are_this_host(uri: str, local: bool) -> None:
    assert is_local_uri(uri) is local
