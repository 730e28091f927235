"""``kvmtune fix --live`` (issue 48, item 5): a running libvirt domain also gets the changes libvirt makes live, and
``undo`` takes them back live.

The one live path is the balloon's statistics period (KVM-MEM-013, ``virDomainSetMemoryStatsPeriod`` with
``VIR_DOMAIN_AFFECT_LIVE``). libvirt's in-process ``test:///default`` driver keeps a running domain's live definition
apart from its persistent one and implements that call; the real libvirtd with a TCG guest is the integration test
at the end (QEMU's balloon device takes the period over QMP whether or not a guest driver runs).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixhelpers import running_guest

from kvmtune.audit.engine import select_rules
from kvmtune.errors import KvmtuneError
from kvmtune.fix.apply import ApplyFailed, apply_plan
from kvmtune.fix.domains import plan_libvirt
from kvmtune.fix.journal import list_journals
from kvmtune.fix.live import LiveSet, read_root
from kvmtune.fix.plan import Plan, XmlEdit
from kvmtune.fix.registry import FixOptions, all_fixers
from kvmtune.fix.status import staged
from kvmtune.fix.undo import undo_journal
from kvmtune.host.root import HostRoot
from kvmtune.runner import Runner

HERE = Path(__file__).resolve().parent
URI = "test:///default"
HOST = HostRoot(str(HERE / "hostroot"))

BALLOONED = """<domain type='{virt}'>
  <name>{name}</name>
  <memory unit='MiB'>64</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64'>hvm</type></os>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='writethrough'/>
      <source file='{image}'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <memballoon model='virtio'/>
  </devices>
</domain>
"""


def _period(xml: str) -> int | None:
    el = read_root(xml, "x").find("devices/memballoon/stats")
    return None if el is None else int(el.get("period") or "0")


@pytest.fixture
def running() -> Iterator[Any]:
    libvirt = pytest.importorskip("libvirt")
    conn = libvirt.open(URI)
    dom = conn.defineXML(BALLOONED.format(virt="kvm", name=f"kvmtune-live-{uuid.uuid4().hex[:8]}",
                                          image="/guest/diskimage1"))
    dom.create()
    yield dom
    if dom.isActive():
        dom.destroy()
    dom.undefine()
    conn.close()


def _plan(dom: Any, *, live: bool, rules: str = "KVM-MEM-013,KVM-STO-002") -> Plan:
    plan = Plan()
    plan_libvirt(URI, [dom.name()], select_rules(rules.split(","), []), FixOptions(host=HOST, live=live), plan)
    return plan


def _journals(path: Path) -> list[Any]:
    return [j for _id, j, _p in list_journals(path) if j is not None]


def test_only_the_balloon_period_fixer_has_a_live_path() -> None:
    """Every other fixer's attribute is one libvirt changes only in the definition (fix/live.py says why)."""
    assert sorted(r for r, f in all_fixers().items() if f.live is not None) == ["KVM-MEM-013"]


def test_without_live_a_running_domain_s_period_is_restart(running: Any) -> None:
    plan = _plan(running, live=False)
    (change,) = plan.changes
    assert isinstance(change, XmlEdit)
    assert {p.rule: p.takes_effect for p in change.planned} == {"KVM-MEM-013": "restart", "KVM-STO-002": "restart"}
    assert "(no --live)" in change.notes[0]


def test_live_sets_the_running_period_and_undo_takes_it_back(running: Any, tmp_path: Path) -> None:
    import libvirt

    inactive_before = running.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE | libvirt.VIR_DOMAIN_XML_SECURE)
    plan = _plan(running, live=True)
    edit, live = plan.changes
    assert isinstance(edit, XmlEdit) and isinstance(live, LiveSet)
    # the period is live; the cache mode, which libvirt cannot change on a running disk, still waits
    assert {p.rule: p.takes_effect for p in edit.planned} == {"KVM-MEM-013": "live", "KVM-STO-002": "restart"}
    assert edit.effect_line() == "restart (KVM-MEM-013 memballoon: live)"
    assert [(p.rule, p.takes_effect) for p in live.planned] == [("KVM-MEM-013", "live")]
    assert (live.prior, live.new) == (0, 10) and "0 → 10" in live.render()
    assert "KVM-MEM-013 also set live" in edit.notes[0]
    doc = plan.to_json()
    assert sorted((c["change"], c["rule"], c["takes_effect"]) for c in doc["changes"]) == [
        (1, "KVM-MEM-013", "live"), (1, "KVM-STO-002", "restart"), (2, "KVM-MEM-013", "live")]
    journals = tmp_path / "journal"
    journals.mkdir(mode=0o700)
    journal = apply_plan(plan, journals)
    assert _period(running.XMLDesc(0)) == 10
    assert _period(running.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)) == 10
    (j,) = _journals(journals)
    assert [e.kind for e in j.entries] == ["domain", "live"]
    entry = j.entries[1]
    assert (entry.takes_effect, entry.prior, entry.new, entry.domain_id) == ("live", 0, 10, running.ID())
    # fix --status: the period is in force; only the cache mode waits for a restart
    (one,) = staged(j and [j], Runner(), HOST)
    assert one.n == 1 and "KVM-STO-002 disk:vda" in one.why and "KVM-MEM-013" not in one.why
    done, problems = undo_journal(journal)
    assert problems == []
    assert any("live balloon statistics period (s) 10 → 0" in d for d in done), done
    assert _period(running.XMLDesc(0)) is None  # libvirt writes no <stats> for period 0
    assert running.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE | libvirt.VIR_DOMAIN_XML_SECURE) == inactive_before
    # a second undo finds both as before
    done, problems = undo_journal(_journals(journals)[0])
    assert problems == [] and done == []  # both entries are marked undone: nothing is touched again


def test_undo_leaves_a_period_someone_changed_since(running: Any, tmp_path: Path) -> None:
    import libvirt

    journals = tmp_path / "journal"
    journals.mkdir(mode=0o700)
    journal = apply_plan(_plan(running, live=True, rules="KVM-MEM-013"), journals)
    running.setMemoryStatsPeriod(5, libvirt.VIR_DOMAIN_AFFECT_LIVE)
    _done, problems = undo_journal(journal)
    assert len(problems) == 1 and "live balloon statistics period (s) is 5, not the 10 kvmtune set" in problems[0]
    assert _period(running.XMLDesc(0)) == 5
    assert journal.state == "undo-incomplete"
    done, problems = undo_journal(journal, force=True)
    assert problems == [] and _period(running.XMLDesc(0)) is None, done


def test_undo_after_a_restart_leaves_the_new_run_alone(running: Any, tmp_path: Path) -> None:
    import libvirt

    journals = tmp_path / "journal"
    journals.mkdir(mode=0o700)
    journal = apply_plan(_plan(running, live=True, rules="KVM-MEM-013"), journals)
    running.destroy()
    running.create()  # starts from the new definition: period 10
    assert _period(running.XMLDesc(0)) == 10
    done, problems = undo_journal(journal)
    assert problems == []
    assert any("started again since" in d for d in done), done
    # the definition is restored; the running guest keeps what it started with until its next start
    assert _period(running.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)) is None
    assert _period(running.XMLDesc(0)) == 10


def test_a_journal_naming_one_domain_with_anothers_uuid_changes_neither(running: Any, tmp_path: Path) -> None:
    """A live entry is undone on the domain its UUID finds; one whose name is another domain's (a journal written
    by hand, or copied from another host) sets nothing: before, ``running``'s period was set back while the line
    named the other domain."""
    import libvirt

    from kvmtune.fix.journal import load

    running.setMemoryStatsPeriod(10, libvirt.VIR_DOMAIN_AFFECT_LIVE)
    journals = tmp_path / "journal"
    journals.mkdir(mode=0o700)
    jid = "20260101T000000Z-abcdef"
    entry = {"kind": "live", "what": "domain x: set live", "status": "done", "uri": URI, "name": "someone-else",
             "uuid": running.UUIDString(), "setting": "memory-stats-period", "prior": 0, "new": 10,
             "domain_id": running.ID()}
    (journals / f"{jid}.json").write_text(json.dumps({
        "kvmtune_journal": 1, "id": jid, "created": "2026-01-01T00:00:00Z", "argv": ["kvmtune", "fix"], "root": "/",
        "state": "applied", "error": None, "history": [], "changes": [entry]}))
    (journals / f"{jid}.json").chmod(0o600)
    done, problems = undo_journal(load(jid, journals, root="/"))
    assert done == [] and len(problems) == 1
    assert f"domain someone-else: the journal's UUID {running.UUIDString()} is domain {running.name()}'s" in problems[0]
    assert _period(running.XMLDesc(0)) == 10


def test_a_stopped_domain_needs_no_live_change(running: Any) -> None:
    running.destroy()
    plan = _plan(running, live=True)
    assert [type(c) for c in plan.changes] == [XmlEdit]
    assert {p.takes_effect for p in plan.changes[0].planned} == {"live"}


def test_a_period_already_live_is_live_without_a_call(running: Any) -> None:
    import libvirt

    running.setMemoryStatsPeriod(10, libvirt.VIR_DOMAIN_AFFECT_LIVE)
    plan = _plan(running, live=True, rules="KVM-MEM-013")
    assert [type(c) for c in plan.changes] == [XmlEdit]
    assert [p.takes_effect for p in plan.changes[0].planned] == ["live"]


def test_a_running_value_changed_after_the_plan_stops_the_apply(running: Any, tmp_path: Path) -> None:
    import libvirt

    plan = _plan(running, live=True, rules="KVM-MEM-013")
    running.setMemoryStatsPeriod(3, libvirt.VIR_DOMAIN_AFFECT_LIVE)
    journals = tmp_path / "journal"
    journals.mkdir(mode=0o700)
    with pytest.raises(KvmtuneError, match=r"running balloon statistics period \(s\) changed since the plan"):
        apply_plan(plan, journals)
    assert _period(running.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)) is None  # nothing written
    assert _journals(journals) == []


def test_a_domain_restarted_between_snapshot_and_call_is_not_set(running: Any, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The live call is made only on the run the journal names: a restart in between (the definition change
    before it made) stops the apply, and undo restores the definition."""
    import libvirt

    plan = _plan(running, live=True, rules="KVM-MEM-013")
    edit = plan.changes[0]
    assert isinstance(edit, XmlEdit)
    real_apply = XmlEdit.apply

    def apply_then_restart(self: XmlEdit, entry: Any, ctx: Any) -> None:
        real_apply(self, entry, ctx)
        running.destroy()
        running.create()

    monkeypatch.setattr(XmlEdit, "apply", apply_then_restart)
    journals = tmp_path / "journal"
    journals.mkdir(mode=0o700)
    with pytest.raises(ApplyFailed, match="restarted since the plan was made") as err:
        apply_plan(plan, journals)
    assert [e.status for e in err.value.journal.entries] == ["done", "failed"]
    _done, problems = undo_journal(err.value.journal)
    assert problems == []
    assert _period(running.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)) is None


def test_live_is_refused_without_connect(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from kvmtune.cli import main

    f = tmp_path / "d.xml"
    f.write_text(BALLOONED.format(virt="kvm", name="d", image="/x"))
    assert main(["fix", str(f), "--live", "--no-config"]) == 2
    assert "--live changes running libvirt domains: it needs --connect URI" in capsys.readouterr().err
    assert main(["fix", "--status", "--live", "--no-config"]) == 2


# --------------------------------------------------------------------------- the real libvirtd, a running guest


@pytest.mark.integration
def test_a_running_guest_under_libvirtd_gets_its_period_live_and_back(
    libvirt_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import libvirt

    from kvmtune.cli import main

    def raw(shared: Path) -> Path:
        image = shared / "disk.raw"
        image.write_bytes(b"\0" * 2**20)
        return image

    journals = tmp_path / "journal"
    journals.mkdir(mode=0o700)
    with running_guest(libvirt_uri, BALLOONED, "live", raw) as (dom, name):
        before = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE | libvirt.VIR_DOMAIN_XML_SECURE)
        args = ["--connect", libvirt_uri, "--domain", name, "--only", "KVM-MEM-013,KVM-STO-002", "--no-config",
                "--journal-dir", str(journals)]
        assert main(["fix", *args[:-2], "--format", "json"]) == 0
        assert {c["rule"]: c["takes_effect"] for c in json.loads(capsys.readouterr().out)["changes"]} == {
            "KVM-MEM-013": "restart", "KVM-STO-002": "restart"}
        assert main(["fix", *args[:-2], "--live", "--format", "json"]) == 0
        changes = json.loads(capsys.readouterr().out)["changes"]
        assert sorted((c["change"], c["rule"], c["takes_effect"]) for c in changes) == [
            (1, "KVM-MEM-013", "live"), (1, "KVM-STO-002", "restart"), (2, "KVM-MEM-013", "live")]
        assert main(["fix", *args, "--live", "--apply", "--yes"]) == 0
        out = capsys.readouterr().out
        assert "Applied 2 change(s)" in out and "1 running domain(s) use the new definition only after" in out
        assert _period(dom.XMLDesc(0)) == 10  # libvirtd's live definition: QEMU took the period over QMP
        assert main(["fix", "--status", "--no-config", "--journal-dir", str(journals)]) == 0
        status = capsys.readouterr().out
        assert "does not have it yet: KVM-STO-002 disk:vda" in status and "KVM-MEM-013" not in status, status
        assert "1 change(s) staged" in status
        (journal,) = journals.glob("*.json")
        assert main(["undo", journal.stem, "--no-config", "--journal-dir", str(journals)]) == 0
        assert "live balloon statistics period (s) 10 → 0" in capsys.readouterr().out
        assert _period(dom.XMLDesc(0)) is None
        assert dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE | libvirt.VIR_DOMAIN_XML_SECURE) == before
