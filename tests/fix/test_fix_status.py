"""``kvmtune fix --status`` (issue 48, item 3): the journaled changes still staged, read back where the platform
says it.

Proxmox VE: the ``qm``/``pvesh`` stand-ins (``tests/fix/standins``) over a copy of the fixture cluster, VM 8006
running; ``qm set`` on it keeps a change pending unless PVE hot-plugs it (a NIC, with ``hotplug`` naming
``network``, the default), and ``pvesh get …/pending`` lists what waits. libvirt: libvirt's own ``test:///default``
driver, in-process, which keeps a running domain's live definition apart from its persistent one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixhelpers import GOLDEN, running_guest

from kvmtune.audit.engine import select_rules
from kvmtune.fix.apply import apply_plan
from kvmtune.fix.domains import plan_libvirt
from kvmtune.fix.journal import list_journals
from kvmtune.fix.plan import Plan
from kvmtune.fix.registry import FixOptions
from kvmtune.fix.status import live_findings, staged
from kvmtune.host.root import HostRoot
from kvmtune.proxmox.pvesh import parse_pending_json
from kvmtune.proxmox.qm import QmError
from kvmtune.runner import Runner

HERE = Path(__file__).resolve().parent
TREE = HERE.parent / "fixtures" / "proxmox" / "cluster"
SRC = HERE.parents[1] / "src"
QM = HERE / "standins" / "qm.py"
PVESH = HERE / "standins" / "pvesh.py"
VM = """agent: 1
boot: order=scsi0;net0
cores: 4
cpu: host
machine: q35
memory: 8192
name: web
net0: virtio=BC:24:11:5A:80:06,bridge=vmbr0
ostype: l26
scsi0: local:8006/vm-8006-disk-0.raw,aio=native,cache=none,discard=on,iothread=1,size=32G,ssd=1
scsihw: lsi
smbios1: uuid=6f1c2a3b-4d5e-4f60-8a71-b2c3d4e5f806
sockets: 1
"""


class Node:
    def __init__(self, tmp: Path, conf: str) -> None:
        self.tree = tmp / "tree"
        shutil.copytree(TREE, self.tree, symlinks=True)
        (self.tree / "etc/pve/nodes/pve1/qemu-server/8006.conf").write_text(conf)
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        for name, script in (("qm", QM), ("pvesh", PVESH)):
            (bin_dir / name).write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
            (bin_dir / name).chmod(0o755)
        self.journals = tmp / "journal"
        self.journals.mkdir(mode=0o700)
        self.env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(SRC),
                    "KVMTUNE_QM_TREE": str(self.tree / "etc/pve"), "KVMTUNE_QM_RUNNING": "8006",
                    "KVMTUNE_JOURNAL_DIR": str(self.journals)}

    def kvmtune(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "kvmtune", *args, "--no-config"], capture_output=True,
                              text=True, timeout=120, env=self.env, check=False)

    def pending(self) -> list[dict[str, Any]]:
        out = subprocess.run([sys.executable, str(PVESH), "get", "/nodes/localhost/qemu/8006/pending",
                              "--output-format", "json"], capture_output=True, text=True, env=self.env, check=True)
        return list(json.loads(out.stdout))


def _plan(node: Node) -> dict[str, str]:
    res = node.kvmtune("fix", "--only", "KVM-STO-012,KVM-NET-008", "--allow-bus-change", "--format", "json")
    assert res.returncode == 0, res.stderr
    return {c["rule"]: c["takes_effect"] for c in json.loads(res.stdout)["changes"] if c["guest"].startswith("pve:8006")}


def test_a_running_pve_vm_scsihw_change_is_restart_and_pending_its_nic_option_live(tmp_path: Path) -> None:
    node = Node(tmp_path, VM)
    assert _plan(node) == {"KVM-STO-012": "restart", "KVM-NET-008": "live"}
    text = node.kvmtune("fix", "--only", "KVM-STO-012,KVM-NET-008", "--allow-bus-change")
    assert "#  takes effect: restart (KVM-NET-008 net:bc:24:11:5a:80:06: live)" in text.stdout
    applied = node.kvmtune("fix", "--only", "KVM-STO-012,KVM-NET-008", "--allow-bus-change", "--apply", "--yes")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    # what PVE's API says: scsihw waits, the NIC was re-plugged with its queues
    waiting = {i["key"]: i for i in node.pending()}
    assert waiting["scsihw"]["pending"] == "virtio-scsi-single" and waiting["scsihw"]["value"] == "lsi"
    assert "pending" not in waiting["net0"] and "queues=4" in waiting["net0"]["value"]
    status = node.kvmtune("fix", "--status")
    assert status.returncode == 0, status.stderr
    lines = [line for line in status.stdout.splitlines() if "staged (" in line]
    assert len(lines) == 1 and "pending: scsihw (qm pending 8006" in lines[0] and "net0" not in lines[0], status.stdout
    assert "staged (restart)" in lines[0]
    doc = json.loads(node.kvmtune("fix", "--status", "--format", "json").stdout)
    assert [s["why"].split(" (")[0] for s in doc["staged"] if "8006" in s["what"]] == ["pending: scsihw"]


def test_a_stopped_pve_vm_takes_both_at_once_and_nothing_is_staged(tmp_path: Path) -> None:
    node = Node(tmp_path, VM)
    node.env["KVMTUNE_QM_RUNNING"] = ""
    assert _plan(node) == {"KVM-STO-012": "live", "KVM-NET-008": "live"}


def test_without_network_hotplug_the_nic_option_waits_too(tmp_path: Path) -> None:
    node = Node(tmp_path, VM + "hotplug: disk,usb\n")
    assert _plan(node) == {"KVM-STO-012": "restart", "KVM-NET-008": "restart"}
    node.kvmtune("fix", "--only", "KVM-STO-012,KVM-NET-008", "--allow-bus-change", "--apply", "--yes")
    status = node.kvmtune("fix", "--status").stdout
    assert "pending: net0, scsihw (qm pending 8006" in status, status


def test_a_live_nic_change_pve_kept_pending_is_journaled_as_restart_and_listed_staged(tmp_path: Path) -> None:
    """The plan says live (network hotplug), PVE's re-plug fails and it keeps the change pending: PVE's word wins."""
    node = Node(tmp_path, VM)
    assert _plan(node)["KVM-NET-008"] == "live"
    node.env["KVMTUNE_QM_HOTPLUG_FAILS"] = "1"
    applied = node.kvmtune("fix", "--only", "KVM-NET-008", "--apply", "--yes")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "pending" in {i["key"]: i for i in node.pending()}["net0"]
    (journal,) = node.journals.glob("*.json")
    (change,) = [c for c in json.loads(journal.read_text())["changes"] if c.get("guest", "").startswith("pve:8006")]
    assert change["takes_effect"] == "restart" and change["pending"] == ["net0"], change
    assert [p["takes_effect"] for p in change["planned"]] == ["live"]  # what the plan said, kept beside PVE's word
    status = node.kvmtune("fix", "--status").stdout
    assert "pending: net0 (qm pending 8006" in status and "staged (restart)" in status, status


def test_status_takes_no_targets() -> None:
    res = subprocess.run([sys.executable, "-m", "kvmtune", "fix", "--status", "--apply", "--no-config"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(SRC)}, check=False)
    assert res.returncode == 2 and "--status lists what the journals hold" in res.stderr


# --------------------------------------------------------------------------- hostile pending answers


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{}", "not a JSON list but dict"),
        ("[1]", "item 1 is not an object"),
        ('[{"key": "scsihw", "pending": "x", "extra": 1}]', "item 1 is not an object of key"),
        ('[{"key": "scsihw", "key": "net0"}]', "field 'key' appears twice in one item"),
        ('[{"key": "scsihw", "pending": "a"}, {"key": "scsihw", "pending": "b"}]', "key 'scsihw' appears twice"),
        ('[{"key": "../x", "pending": "a"}]', "is not a config key"),
        ('[{"key": "scsi*", "pending": "a"}]', "is not a config key"),
        ('[{"key": "net0", "pending": "virtio\\nbridge=x"}]', "a line break or NUL"),
        ('[{"key": "net0", "pending": "virtio\\u0000"}]', "a line break or NUL"),
        ('[{"key": "net0", "pending": ["a"]}]', "pending is a list"),
        ('[{"key": "net0", "pending": true}]', "pending is a bool"),
        ('[{"key": "net0", "pending": NaN}]', "not JSON"),
        ('[{"key": "net0", "delete": 3}]', "delete is '3'"),
        ('[{"key": "net0", "delete": true}]', "delete is 'True'"),
        ("[" + "[" * 100_000 + "]" * 100_000 + "]", "not JSON"),
        ("", "not JSON"),
    ],
)
def test_a_hostile_pending_answer_is_one_line(text: str, problem: str) -> None:
    with pytest.raises(QmError) as err:
        parse_pending_json(text, "8006")
    assert problem in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith("pvesh get /nodes/localhost/qemu/8006/pending: ")


def test_a_pending_answer_keeps_only_what_waits() -> None:
    text = json.dumps([
        {"key": "scsihw", "value": "lsi", "pending": "virtio-scsi-single"},
        {"key": "memory", "value": 8192},
        {"key": "vmgenid", "value": "x", "delete": 1},
        {"key": "cores", "value": 2, "pending": 4},
        {"key": "description", "value": "a\nb", "pending": "c\nd"},  # notes keep their line breaks
        {"key": "net0", "value": "virtio=AA:BB:CC:DD:EE:FF,bridge=vmbr0\u2028x"},  # U+2028 is no line break here
    ])
    assert parse_pending_json(text, "8006") == {"scsihw": "virtio-scsi-single", "vmgenid": None, "cores": "4",
                                                "description": "c\nd"}


# --------------------------------------------------------------------------- libvirt: live against inactive XML


@pytest.fixture
def test_domain() -> Iterator[Any]:
    libvirt = pytest.importorskip("libvirt")
    conn = libvirt.open("test:///default")
    xml = (GOLDEN / "ALL" / "legacy-everything.in.xml").read_text()
    xml = xml.replace("<name>golden-legacy-everything</name>", f"<name>kvmtune-status-{uuid.uuid4().hex[:8]}</name>")
    dom = conn.defineXML(xml)
    dom.create()
    yield dom
    if dom.isActive():
        dom.destroy()
    dom.undefine()
    conn.close()


def test_a_running_libvirt_domain_s_cache_fix_is_restart_and_staged_until_it_restarts(
    test_domain: Any, tmp_path: Path
) -> None:
    # the test driver's connections share one in-process state: apply_plan's connection sees the same domain
    plan = Plan()
    rules = select_rules(["KVM-STO-002"], [])
    plan_libvirt("test:///default", [test_domain.name()], rules, FixOptions(host=HostRoot(str(HERE / "hostroot"))),
                 plan)
    (change,) = plan.changes
    assert change.takes_effect() == "restart"
    assert {p.rule for p in change.planned} == {"KVM-STO-002"}
    journals = tmp_path / "journal"
    journals.mkdir(mode=0o700)
    apply_plan(plan, journals)
    host = HostRoot(str(HERE / "hostroot"))
    loaded = [j for _id, j, _p in list_journals(journals) if j is not None]
    (entry,) = loaded[0].entries
    assert entry.takes_effect == "restart"
    (one,) = staged(loaded, Runner(), host)
    assert one.takes_effect == "restart" and "does not have it yet: KVM-STO-002" in one.why
    # someone redefines it after kvmtune: not judged
    conn = test_domain.connect()
    import libvirt

    mine = test_domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
    conn.defineXML(mine.replace("<memory unit='KiB'>", "<memory unit='KiB'>1", 1))
    (one,) = staged(loaded, Runner(), host)
    assert one.why == "cannot tell: redefined since kvmtune changed it"
    conn.defineXML(mine)
    # a shutdown and a start: the live XML is the new definition, nothing is staged
    test_domain.destroy()
    test_domain.create()
    assert staged(loaded, Runner(), host) == []


def test_live_xml_is_read_as_hostile_input(tmp_path: Path) -> None:
    from kvmtune.errors import KvmtuneError

    host = HostRoot(str(HERE / "hostroot"))
    with pytest.raises(KvmtuneError, match="live"):
        live_findings("<domain>" + " " * (64 * 2**20) + "</domain>", "test:///default#x (live)", {"KVM-STO-004"}, host)
    bomb = ('<!DOCTYPE d [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]>'
            "<domain type='kvm'><name>&b;</name></domain>")
    with pytest.raises(KvmtuneError):
        live_findings(bomb, "test:///default#x (live)", {"KVM-STO-004"}, host)


# --------------------------------------------------------------------------- the real libvirtd, a running guest

DISKED = """<domain type='{virt}'>
  <name>{name}</name>
  <memory unit='MiB'>64</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64'>hvm</type></os>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2' cache='writethrough'/>
      <source file='{image}'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <memballoon model='none'/>
  </devices>
</domain>
"""


@pytest.mark.integration
def test_a_running_guest_under_libvirtd_keeps_its_cache_fix_staged_until_a_restart(
    libvirt_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvmtune.cli import main

    if shutil.which("qemu-img") is None:
        pytest.skip("no qemu-img")

    def qcow2(shared: Path) -> Path:
        image = shared / "disk.qcow2"
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "16M"], check=True)
        return image

    journals = tmp_path / "journal"
    journals.mkdir(mode=0o700)
    with running_guest(libvirt_uri, DISKED, "effect", qcow2) as (dom, name):
        args = ["--connect", libvirt_uri, "--domain", name, "--only", "KVM-STO-002", "--no-config",
                "--journal-dir", str(journals)]
        assert main(["fix", *args[:-2], "--format", "json"]) == 0
        changes = json.loads(capsys.readouterr().out)["changes"]
        assert [c["takes_effect"] for c in changes] == ["restart"] and changes[0]["rule"] == "KVM-STO-002"
        assert main(["fix", *args, "--apply", "--yes"]) == 0
        capsys.readouterr()
        assert main(["fix", "--status", "--no-config", "--journal-dir", str(journals)]) == 0
        out = capsys.readouterr().out
        assert "staged (restart): the running domain does not have it yet: KVM-STO-002 disk:vda" in out, out
        dom.destroy()
        dom.create()
        assert main(["fix", "--status", "--no-config", "--journal-dir", str(journals)]) == 0
        assert "0 change(s) staged in 1 journal(s)" in capsys.readouterr().out


def test_status_lists_a_journal_with_a_bad_takes_effect_as_refused(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from kvmtune.cli import main

    journals = tmp_path / "journal"
    journals.mkdir(mode=0o700)
    jid = "20260101T000000Z-abcdef"
    doc = {"kvmtune_journal": 1, "id": jid, "created": "2026-01-01T00:00:00Z", "argv": [], "root": "/",
           "state": "applied", "error": None, "history": [],
           "changes": [{"kind": "domain", "what": "domain x: redefine", "status": "done", "uri": "test:///default",
                        "name": "x", "uuid": "u", "prior_xml": "<domain/>", "takes_effect": "\u001b[2Jsoon"}]}
    path = journals / f"{jid}.json"
    path.write_text(json.dumps(doc))
    path.chmod(0o600)
    assert main(["fix", "--status", "--no-config", "--journal-dir", str(journals)]) == 0
    out = capsys.readouterr().out
    assert f"refused: {jid}: " in out and "unknown takes_effect" in out and "\x1b" not in out
    assert "0 change(s) staged in 0 journal(s)" in out
