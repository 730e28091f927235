"""Against a real libvirtd: define, fix --apply (defineXML), dumpxml shows it, undo restores the
definition exactly. Domains are named kvmtune-test-<random>-… and always undefined."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fixhelpers import FIXTURE_HOST, GOLDEN
from lxml import etree

from kvmtune.audit.engine import select_rules
from kvmtune.cli import main
from kvmtune.fix.apply import ApplyFailed, apply_plan
from kvmtune.fix.domains import plan_libvirt
from kvmtune.fix.plan import Plan, XmlEdit
from kvmtune.fix.registry import FixOptions
from kvmtune.host.root import HostRoot

pytestmark = pytest.mark.integration

LEGACY = GOLDEN / "ALL" / "legacy-everything.in.xml"
SMALL = """<domain type='{virt}'>
  <name>{name}</name>
  <memory unit='MiB'>64</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64'>hvm</type></os>
  <devices>
    <!-- no disk, no rng, balloon off: the fixes need no files on the host -->
    <memballoon model='none'/>
  </devices>
</domain>
"""


def inactive(dom: Any) -> str:
    import libvirt

    return str(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE | libvirt.VIR_DOMAIN_XML_SECURE))


@pytest.fixture
def define(libvirt_uri: str) -> Iterator[Callable[[str, str], Any]]:
    import libvirt

    conn = libvirt.open(libvirt_uri)
    tag = uuid.uuid4().hex[:8]
    made: list[str] = []

    def _define(xml: str, suffix: str) -> Any:
        root = etree.fromstring(xml.encode())
        name = f"kvmtune-test-{tag}-{suffix}"
        name_el = root.find("name")
        assert name_el is not None
        name_el.text = name
        for u in root.findall("uuid"):
            root.remove(u)
        made.append(name)
        return conn.defineXML(etree.tostring(root).decode())

    try:
        yield _define
    finally:
        for name in made:
            try:
                dom = conn.lookupByName(name)
            except libvirt.libvirtError:
                continue
            if dom.isActive():
                dom.destroy()
            dom.undefine()
        conn.close()


def jid_of(out: str) -> str:
    return next(ln for ln in out.splitlines() if ln.startswith("Undo with:")).rsplit(" ", 1)[1]


def test_define_fix_apply_dumpxml_undo(libvirt_uri: str, define: Callable[[str, str], Any],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    dom = define(LEGACY.read_text(), "legacy")
    name, original = dom.name(), inactive(dom)

    assert main(["fix", "--connect", libvirt_uri, "--domain", name]) == 0
    out = capsys.readouterr().out
    assert f"--- {libvirt_uri}#{name}" in out and "cache='writethrough'" in out
    assert inactive(dom) == original

    assert main(["fix", "--connect", libvirt_uri, "--domain", name, "--allow-bus-change", "--apply", "--yes"]) == 0
    jid = jid_of(capsys.readouterr().out)
    new = etree.fromstring(inactive(dom).encode())
    assert new.xpath("string(devices/disk[@device='disk']/target/@bus)") == "virtio"
    assert new.xpath("string(devices/disk[@device='disk']/target/@dev)") == "vda"
    assert new.xpath("string(devices/disk[@device='disk']/driver/@cache)") == "none"
    assert new.xpath("string(devices/disk[@device='disk']/driver/@io)") == "native"
    assert new.xpath("string(devices/rng/backend)") == "/dev/urandom"
    assert new.find("memoryBacking/nosharepages") is not None

    assert main(["fix", "--connect", libvirt_uri, "--domain", name, "--allow-bus-change"]) == 0
    assert "Nothing to change." in capsys.readouterr().out

    assert main(["audit", "--format", "json", "--root", str(FIXTURE_HOST), "--connect", libvirt_uri]) in (0, 1, 2)
    left = {f["rule"] for f in json.loads(capsys.readouterr().out)["findings"] if f["target"]["domain"] == name}
    assert not left & {"KVM-STO-001", "KVM-STO-002", "KVM-NET-001", "KVM-NET-002", "KVM-SEC-001", "KVM-MEM-002"}

    assert main(["undo", jid]) == 0
    assert "definition restored" in capsys.readouterr().out
    assert inactive(dom) == original


def test_running_domain_is_not_changed_live(libvirt_uri: str, define: Callable[[str, str], Any],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    import libvirt

    virt = "kvm" if os.path.exists("/dev/kvm") else "qemu"
    dom = define(SMALL.format(virt=virt, name="x"), "running")
    try:
        dom.create()
    except libvirt.libvirtError as exc:
        pytest.skip(f"cannot start a guest here: {exc}")
    live, original = dom.XMLDesc(0), inactive(dom)
    assert main(["fix", "--connect", libvirt_uri, "--domain", dom.name(), "--apply", "--yes"]) == 0
    out = capsys.readouterr().out
    assert "running: not changed live" in out and "use the new definition only after a shutdown and start" in out
    jid = jid_of(out)
    assert dom.isActive()
    assert dom.XMLDesc(0) == live  # the running guest is untouched
    assert "<rng model='virtio'>" in inactive(dom)  # its next start gets the fix
    assert main(["undo", jid]) == 0
    capsys.readouterr()
    assert inactive(dom) == original
    assert dom.XMLDesc(0) == live


def test_libvirt_rejects_the_second_definition(libvirt_uri: str, define: Callable[[str, str], Any],
                                               journal_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    virt = "kvm" if os.path.exists("/dev/kvm") else "qemu"
    first = define(SMALL.format(virt=virt, name="x"), "reject-a")
    second = define(SMALL.format(virt=virt, name="x"), "reject-b")
    before = {first.name(): inactive(first), second.name(): inactive(second)}
    plan = Plan()
    options = FixOptions(host=HostRoot(str(FIXTURE_HOST)))
    plan_libvirt(libvirt_uri, [first.name(), second.name()], select_rules(), options, plan)
    assert len(plan.changes) == 2
    bad = plan.changes[1]
    assert isinstance(bad, XmlEdit)
    bad.after = bad.after.replace("<rng model='virtio'>", "<rng model='no-such-model'>")
    with pytest.raises(ApplyFailed, match="libvirt rejected the new definition") as info:
        apply_plan(plan, journal_dir)
    journal = info.value.journal
    assert [e.status for e in journal.entries] == ["done", "failed"]
    assert inactive(first) != before[first.name()]
    assert inactive(second) == before[second.name()]
    assert main(["undo", journal.id]) == 0
    capsys.readouterr()
    assert inactive(first) == before[first.name()]
    assert inactive(second) == before[second.name()]


def test_killed_between_two_domains(libvirt_uri: str, define: Callable[[str, str], Any],
                                    journal_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    virt = "kvm" if os.path.exists("/dev/kvm") else "qemu"
    doms = [define(SMALL.format(virt=virt, name="x"), f"kill-{n}") for n in (1, 2)]
    before = [inactive(d) for d in doms]
    argv = [sys.executable, "-m", "kvmtune", "fix", "--connect", libvirt_uri, "--apply", "--yes"]
    for d in doms:
        argv += ["--domain", d.name()]
    env = dict(os.environ, KVMTUNE_TEST_KILL_AFTER_CHANGE="1", KVMTUNE_JOURNAL_DIR=str(journal_dir))
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == -9, proc.stderr
    assert inactive(doms[0]) != before[0] and inactive(doms[1]) == before[1]
    (jfile,) = journal_dir.glob("*.json")
    assert main(["undo", jfile.stem]) == 0
    capsys.readouterr()
    assert [inactive(d) for d in doms] == before


def test_unknown_domain(libvirt_uri: str, journal_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = f"kvmtune-test-{uuid.uuid4().hex[:8]}-absent"
    assert main(["fix", "--connect", libvirt_uri, "--domain", name, "--apply", "--yes"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"kvmtune: {libvirt_uri}: no domain named {name!r}"
    assert list(journal_dir.iterdir()) == []
