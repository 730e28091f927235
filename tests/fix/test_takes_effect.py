"""The ``takes_effect`` contract (issue 48): every fixer, over its fixtures and the example domains, as a domain
file and as a libvirt domain stopped and running, plans changes that each say when they take effect, one of the
five words; and every fixable rule's doc cites the platform's rule it follows.

The libvirt domains are libvirt's own ``test:///default`` driver (in-process, no daemon): it keeps a running
domain's live definition apart from its persistent one, as libvirtd does, so a running domain's plan is made
from a domain that really is running.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixhelpers import FIXTURE_HOST, GOLDEN
from lxml import etree

from kvmtune.audit.rule import Rule, all_rules
from kvmtune.fix.domains import fix_guest, plan_libvirt
from kvmtune.fix.effect import VALUES, Planned
from kvmtune.fix.host import plan_host
from kvmtune.fix.plan import DropIn, Plan, SysfsWrite
from kvmtune.fix.registry import FixOptions, all_fixers
from kvmtune.fix.remedies import Remedy, declared
from kvmtune.host.root import HostRoot

REPO = Path(__file__).resolve().parents[2]
RULE_FIXTURES = REPO / "tests" / "rules"
EXAMPLES = sorted((REPO / "src" / "kvmtune" / "examples").glob("*.xml"))
HOST_TREES = sorted(p for p in (REPO / "tests" / "fixtures" / "hosts").iterdir() if p.is_dir())
XML_RULES = [r for r in all_rules() if declared(r.fix_kind) is Remedy.GUEST_XML]
TEST_URI = "test:///default"


def _ids(r: type[Rule]) -> str:
    return r.id


def _cases(rule_id: str) -> list[Path]:
    return (sorted((RULE_FIXTURES / rule_id / "bad").glob("*.xml")) + sorted((GOLDEN / rule_id).glob("*.in.xml"))
            + EXAMPLES)


def _options() -> FixOptions:
    return FixOptions(allow_bus_change=True, allow_cpu_change=True, assume_this_host=True,
                      host=HostRoot(str(FIXTURE_HOST)), use_waivers=False,
                      named_rules=frozenset(r.id for r in XML_RULES))


def _check(planned: list[Planned], want: str, where: str) -> None:
    assert planned, f"{where}: a change with no planned item"
    for p in planned:
        assert p.takes_effect in VALUES, f"{where}: {p}"
        assert p.takes_effect == want, f"{where}: {p.rule} {p.target} says {p.takes_effect}, not {want}"
        assert p.rule and p.target and p.what and p.guest, f"{where}: {p}"


@pytest.fixture
def libvirt_test() -> Iterator[tuple[Any, list[Any]]]:
    libvirt = pytest.importorskip("libvirt")
    conn = libvirt.open(TEST_URI)
    made: list[Any] = []
    yield conn, made
    for dom in made:
        if dom.isActive():
            dom.destroy()
        dom.undefine()
    conn.close()


def _define(conn: Any, data: bytes, made: list[Any]) -> Any | None:
    """The fixture as a test-driver domain, under its own name (a rule may judge the name); None where the test
    driver refuses the XML or a domain of that name exists."""
    import libvirt

    root = etree.fromstring(data)
    for el in root.findall("uuid"):
        root.remove(el)
    try:
        dom = conn.defineXML(etree.tostring(root).decode())
    except libvirt.libvirtError:
        return None
    made.append(dom)
    return dom


def _drop(dom: Any, made: list[Any]) -> None:
    if dom.isActive():
        dom.destroy()
    dom.undefine()
    made.remove(dom)


@pytest.mark.parametrize("rule", XML_RULES, ids=_ids)
def test_every_fixer_says_when_its_change_takes_effect(rule: type[Rule], libvirt_test: tuple[Any, list[Any]]) -> None:
    conn, made = libvirt_test
    fixer = all_fixers()[rule.id]
    seen: dict[str, int] = {"file": 0, "stopped": 0, "running": 0}
    for case in _cases(rule.id):
        data = case.read_bytes()
        # as a domain file: only domains defined from it from now on
        guest, result = fix_guest(data, str(case), "xml", [rule], _options())
        if result.after is None:
            continue
        planned = result.planned(guest.name, origin="xml", active=False)
        assert len(planned) == len(result.reasons), case
        _check(planned, "new-instances", f"{case.name} (file)")
        seen["file"] += 1
        dom = _define(conn, data, made)
        if dom is None:
            continue
        for state in ("stopped", "running"):
            if state == "running":
                dom.create()
            plan = Plan()
            plan_libvirt(TEST_URI, [dom.name()], [rule], _options(), plan)
            if not plan.changes:
                continue
            (change,) = plan.changes
            want = fixer.takes_effect(origin="libvirt", active=state == "running")
            assert want == ("restart" if state == "running" else "live")
            _check(change.planned, want, f"{case.name} ({state})")
            assert change.takes_effect() == want
            assert f"#  takes effect: {want}\n" in plan.render()
            if state == "running":
                # fix --live: live only where the fixer has a live path libvirt applies to a running domain (and
                # then one more change sets it there); every other fixer's change still waits for a restart
                options = _options()
                options.live = True
                plan = Plan()
                plan_libvirt(TEST_URI, [dom.name()], [rule], options, plan)
                want = "live" if fixer.live is not None else "restart"
                _check(plan.changes[0].planned, want, f"{case.name} (running, --live)")
                assert [c.kind for c in plan.changes[1:]] == (["live"] if fixer.live is not None else [])
            seen[state] += 1
        _drop(dom, made)
    assert seen["file"], f"{rule.id}: no fixture or example its fixer changes"
    assert seen["stopped"] and seen["running"], f"{rule.id}: no fixture the test driver defines ({seen})"


@pytest.mark.parametrize("tree", HOST_TREES, ids=lambda p: p.name)
def test_host_changes_say_live_for_the_runtime_value_and_host_boot_for_the_drop_in(tree: Path) -> None:
    for profile in ("virtual-host", "network-latency"):
        plan = plan_host(str(tree), profile)
        for change in plan.changes:
            assert change.planned, change.title()
            want = "live" if isinstance(change, SysfsWrite) else "host-boot"
            assert isinstance(change, SysfsWrite | DropIn)
            assert {p.takes_effect for p in change.planned} == {want}, change.title()
            if isinstance(change, SysfsWrite):
                # a rule it answers, or none (a profile's own setting, tuned's dirty_ratio)
                assert all(re.fullmatch(r"(KVM-HST-\d{3})?", p.rule) for p in change.planned), change.planned
                assert all(p.target == change.path for p in change.planned)


_CITES = {
    "xml": ("--config", "next start"),
    "sysctl": ("sysctl.d(5)", "host-boot"),
    "sysfs": ("tmpfiles.d(5)", "host-boot"),
    "udev": ("udev(7)", "host-boot"),
    "modprobe": ("modprobe.d(5)", "host-boot"),
    "cmdline": ("kernel-parameters.txt", "host-boot"),
    "image": ("guest-offline",),
}


@pytest.mark.parametrize("rule", [r for r in all_rules() if r.fix_kind != "manual"], ids=_ids)
def test_every_fixable_rule_doc_cites_when_its_fix_takes_effect(rule: type[Rule]) -> None:
    doc = rule.doc_path().read_text(encoding="utf-8")
    refs = doc.split("## References", 1)[1]
    lines = [line for line in refs.splitlines() if line.startswith("- When it takes effect:")]
    assert len(lines) == 1, f"{rule.doc_path().name}: one '- When it takes effect:' reference"
    for cite in _CITES[rule.fix_kind]:
        assert cite in lines[0], f"{rule.doc_path().name}: the takes-effect line does not cite {cite!r}"
    if rule.pve is not None:
        wanted = "guest-offline" if rule.pve.kind == "bus" else "hotplug"
        assert wanted in lines[0], f"{rule.doc_path().name}: its Proxmox VE form's rule ({wanted}) is not cited"


# --------------------------------------------------------------------------- shown everywhere


def _run(*argv: str) -> tuple[int, str, str]:
    import contextlib
    import io

    from kvmtune.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_fix_format_json_lists_each_change_with_when_it_takes_effect(tmp_path: Path) -> None:
    import json

    domain = tmp_path / "web01.xml"
    # a C1 control (CSI) in the name: valid XML, never raw on a terminal, not even inside JSON
    domain.write_bytes(EXAMPLES[-1].read_bytes().replace(b"<name>web01-legacy</name>", "<name>web\u009b01</name>".encode()))
    code, out, _err = _run("fix", str(domain), "--format", "json", "--no-config")
    assert code == 0
    assert "\u009b" not in out
    doc = json.loads(out)
    assert doc["changes"], doc
    for item in doc["changes"]:
        assert set(item) == {"change", "guest", "rule", "target", "what", "takes_effect"}
        assert item["takes_effect"] == "new-instances" and item["guest"] == "web\u009b01"
        assert re.fullmatch(r"KVM-[A-Z]{3}-\d{3}", item["rule"])
    assert domain.read_bytes() == EXAMPLES[-1].read_bytes().replace(b"<name>web01-legacy</name>",
                                                                    "<name>web\u009b01</name>".encode())
    code, _out, err = _run("fix", str(domain), "--format", "json", "--apply", "--yes", "--no-config")
    assert code == 2 and "--format json prints the plan" in err


def test_the_journal_keeps_when_each_change_takes_effect(tmp_path: Path) -> None:
    import json

    domain = tmp_path / "web01.xml"
    domain.write_bytes(EXAMPLES[-1].read_bytes())
    journals = tmp_path / "journal"
    code, out, _err = _run("fix", str(domain), "--apply", "--yes", "--no-config", "--journal-dir", str(journals))
    assert code == 0, out
    (path,) = journals.glob("*.json")
    (entry,) = json.loads(path.read_text())["changes"]
    assert entry["takes_effect"] == "new-instances"
    assert entry["planned"] and {p["takes_effect"] for p in entry["planned"]} == {"new-instances"}
    code, out, _err = _run("undo", "--journal-dir", str(journals), path.stem, "--yes", "--no-config")
    assert code == 0 and domain.read_bytes() == EXAMPLES[-1].read_bytes()


def test_audit_says_when_the_fix_applies_in_text_json_and_sarif(tmp_path: Path) -> None:
    import json

    _code, text, _err = _run("audit", str(EXAMPLES[-1]), "--no-config")
    assert "(applies to guests defined from it from now on)" in text
    _code, out, _err = _run("audit", str(EXAMPLES[-1]), "--format", "json", "--no-config")
    fixes = [f["fix"] for f in json.loads(out)["findings"]]
    assert {f.get("takes_effect") for f in fixes if f["kind"] == "xml"} == {"new-instances"}
    assert all("takes_effect" not in f for f in fixes if f["kind"] == "manual")
    _code, out, _err = _run("audit", str(EXAMPLES[-1]), "--format", "sarif", "--no-config")
    results = json.loads(out)["runs"][0]["results"]
    assert {r["properties"]["fix"]["takes_effect"] for r in results if "fix" in r["properties"]} == {"new-instances"}


def test_audit_of_a_pve_tree_says_when_each_qm_set_would_apply() -> None:
    import json

    tree = REPO / "tests" / "fixtures" / "proxmox" / "cluster"
    _code, out, _err = _run("audit", "--root", str(tree), "--format", "json", "--no-config")
    when = {(f["target"]["domain"].split()[0], f["rule"]): f["fix"].get("takes_effect")
            for f in json.loads(out)["findings"] if f["fix"]["kind"] == "xml"}
    assert when[("pve:102", "KVM-STO-012")] == "restart"  # the SCSI controller: pending until the VM's start
    assert when[("pve:102", "KVM-NET-008")] == "live"  # a NIC option, hotplug's default names network
    assert when[("pve:101", "KVM-STO-001")] == "guest-offline"  # a volume moved to virtio: the VM stopped
    assert when[("pve:8006", "KVM-SEC-001")] == "restart"  # an rng device: not hot-pluggable
