"""Issue 32's misses (items 5-12, 15): what the new and widened rules say, beyond firing on their fixtures
(tests/rules/<ID>/): the finding's numbers and advice, when a rule stays silent, and the readers it needs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.audit.finding import Finding, Severity
from kvmtune.audit.rule import rule_by_id
from kvmtune.cli import main
from kvmtune.domain.xml import guest_from_tree, load_guest_file, parse_xml_bytes
from kvmtune.host.facts import HostFacts
from kvmtune.host.root import HostRoot
from kvmtune.model.guest import Guest
from kvmtune.model.inside import GuestInside
from kvmtune.qemu.cmdline import guest_from_text
from kvmtune.rules.cpu_memory.cpu_model_generic import model_features
from kvmtune.rules.storage.machine_type_single_queue import single_queue_machine

HERE = Path(__file__).parent
HOST = HERE.parent / "fixtures" / "hosts" / "rules-default"


def audit(rule_id: str, *guests: Guest) -> list[Finding]:
    rule = rule_by_id(rule_id)
    assert rule is not None
    ctx = AuditContext(host=HostRoot(str(HOST)))
    found = run_rules(ctx, list(guests), rules=[rule])
    assert ctx.errors == []
    return found


def fixture(rule_id: str, kind: str, name: str, *, here: bool = True) -> Guest:
    guest = load_guest_file(HERE / rule_id / kind / name)
    guest.on_audited_host = here
    return guest


def domain(body: str, name: str = "vm") -> Guest:
    xml = f"<domain type='kvm'><name>{name}</name>{body}<devices/></domain>"
    return guest_from_tree(parse_xml_bytes(xml.encode(), f"{name}.xml"), f"{name}.xml")


# --- the readers the rules need -----------------------------------------------------------------

def test_domain_readers_take_clock_current_memory_libosinfo_and_page_sizes() -> None:
    guest = domain(
        "<metadata><libosinfo:libosinfo xmlns:libosinfo='http://libosinfo.org/xmlns/libvirt/domain/1.0'>"
        "<libosinfo:os id='http://debian.org/debian/12'/></libosinfo:libosinfo></metadata>"
        "<memory unit='GiB'>16</memory><currentMemory unit='MiB'>2048</currentMemory>"
        "<memoryBacking><hugepages><page size='1' unit='G'/><page size='2048'/></hugepages></memoryBacking>"
        "<clock offset='localtime'/>"
    )
    assert guest.libosinfo_id == "http://debian.org/debian/12"
    assert guest.current_memory_kib == 2 * 1024 * 1024
    assert guest.hugepage_sizes_kib == (2048, 1024 * 1024)
    assert guest.clock_offset == "localtime"
    bare = domain("")
    assert (bare.libosinfo_id, bare.current_memory_kib, bare.hugepage_sizes_kib, bare.clock_offset) == (None, None, (), None)


@pytest.mark.parametrize(("rtc", "offset"), [("base=localtime", "localtime"), ("base=utc,driftfix=slew", "utc"),
                                             ("base=2006-06-17T16:01:21", "variable")])
def test_command_line_rtc_is_the_clock_offset(rtc: str, offset: str) -> None:
    guest = guest_from_text(f"qemu-system-x86_64 -name g -accel kvm -rtc {rtc}", "g.args")
    assert guest.clock_offset == offset
    assert guest.where("clock").startswith("-rtc")


def test_host_facts_read_each_hugepage_pool(tmp_path: Path) -> None:
    for size, count in (("2048", "512"), ("1048576", "0")):
        d = tmp_path / f"sys/kernel/mm/hugepages/hugepages-{size}kB"
        d.mkdir(parents=True)
        (d / "nr_hugepages").write_text(count + "\n")
    assert HostFacts(HostRoot(str(tmp_path))).hugepages_reserved == {2048: 512, 1024 * 1024: 0}
    assert HostFacts(HostRoot(str(tmp_path / "nothing"))).hugepages_reserved == {}


# --- 5. a Linux guest's RTC in local time ----------------------------------------------------------

def test_linux_by_its_guest_agent_is_enough() -> None:
    guest = fixture("KVM-GST-002", "good", "unknown-os-localtime.xml")
    assert audit("KVM-GST-002", guest) == []  # local time, nothing known: Windows wants it so
    guest.inside = GuestInside(via="recorded answers", os_kind="linux")
    [f] = audit("KVM-GST-002", guest)
    assert f.confidence == "certain" and "guest agent" in f.actual


def test_a_debian_guest_in_local_time_is_reported_certain() -> None:
    [f] = audit("KVM-GST-002", fixture("KVM-GST-002", "bad", "debian-localtime.xml"))
    assert (f.severity, f.confidence) == (Severity.MEDIUM, "certain")
    assert "http://debian.org/debian/12" in f.actual and f.expected == "offset='utc'"


# --- 6. Windows client editions with more than two sockets -----------------------------------------

def test_windows_11_on_eight_sockets_uses_two() -> None:
    [f] = audit("KVM-WIN-005", fixture("KVM-WIN-005", "bad", "win11-eight-sockets.xml"))
    assert f.actual == "sockets='8' for 8 vCPUs: Windows 11 uses 2, 6 stay idle"
    assert (f.severity, f.confidence) == (Severity.HIGH, "certain")
    assert "cores='8'" in f.expected


def test_windows_10_by_name_without_topology_is_possible() -> None:
    [f] = audit("KVM-WIN-005", fixture("KVM-WIN-005", "bad", "win10-no-topology.xml"))
    assert f.actual.startswith("no <topology> (libvirt: one socket per vCPU) for 6 vCPUs: Windows 10 uses 2")
    assert f.confidence == "possible"


# --- 7. NUMA cells ---------------------------------------------------------------------------------

def test_numa_cells_name_the_vcpus_left_out_and_the_memory() -> None:
    [cpus] = audit("KVM-CPU-027", fixture("KVM-CPU-027", "bad", "vcpus-outside-cells.xml"))
    assert cpus.actual == "vCPUs 6-7 in no cell (of 8)" and cpus.severity == Severity.MEDIUM
    [mem] = audit("KVM-CPU-027", fixture("KVM-CPU-027", "bad", "memory-does-not-add-up.xml"))
    assert mem.actual == "cells hold 8.0 GiB, <memory> says 16.0 GiB"
    assert mem.severity == Severity.LOW


def test_numa_cells_overlapping_and_beyond_vcpu() -> None:
    guest = domain("<vcpu>4</vcpu><memory unit='GiB'>4</memory><cpu><numa>"
                   "<cell id='0' cpus='0-2' memory='2' unit='GiB'/><cell id='1' cpus='2-4' memory='2' unit='GiB'/>"
                   "</numa></cpu>")
    [f] = audit("KVM-CPU-027", guest)
    assert f.actual == "cells name vCPUs 4, beyond <vcpu> 4; vCPUs 2 in two cells"


# --- 8. a balloon far below the defined memory -----------------------------------------------------

def test_memory_devices_and_rounding_are_not_a_mismatch() -> None:
    rounded = domain("<vcpu>2</vcpu><memory unit='KiB'>1049600</memory><cpu><numa>"
                     "<cell id='0' cpus='0-1' memory='1048576' unit='KiB'/></numa></cpu>")
    assert audit("KVM-CPU-027", rounded) == []  # 1 MiB apart: libvirt's alignment
    xml = ("<domain type='kvm'><name>d</name><maxMemory slots='4' unit='GiB'>16</maxMemory>"
           "<memory unit='GiB'>8</memory><vcpu>2</vcpu><cpu><numa><cell id='0' cpus='0-1' memory='1' unit='GiB'/>"
           "</numa></cpu><devices><memory model='dimm'><target><size unit='MiB'>512</size><node>0</node></target>"
           "</memory></devices></domain>")
    dimm = guest_from_tree(parse_xml_bytes(xml.encode(), "d.xml"), "d.xml")
    assert audit("KVM-CPU-027", dimm) == []  # a DIMM on top of the cells: not judged on memory


def test_balloon_far_below_only_in_a_stored_definition() -> None:
    guest = fixture("KVM-MEM-011", "bad", "current-2-of-16.xml")
    [f] = audit("KVM-MEM-011", guest)
    assert f.actual == "currentMemory 2.0 GiB of 16.0 GiB (12%)"
    guest.active = True  # a running domain's currentMemory is where its balloon is now
    assert audit("KVM-MEM-011", guest) == []


# --- 9. with this host known -----------------------------------------------------------------------

def test_crowded_pins_are_named() -> None:
    [f] = audit("KVM-CPU-028", fixture("KVM-CPU-028", "bad", "two-vcpus-one-cpu.xml", here=False))
    assert f.actual == "vCPUs 2,3 on CPU 2" and f.severity == Severity.MEDIUM


@pytest.mark.parametrize(("rule_id", "name"), [("KVM-CPU-029", "strict-node-3.xml"), ("KVM-MEM-012", "one-gib-pages.xml")])
def test_will_not_start_needs_this_host(rule_id: str, name: str) -> None:
    [f] = audit(rule_id, fixture(rule_id, "bad", name))
    assert f.severity == Severity.HIGH
    assert audit(rule_id, fixture(rule_id, "bad", name, here=False)) == []  # a file from elsewhere


def test_numatune_names_the_missing_node_and_hugepages_the_reserved_sizes() -> None:
    [numa] = audit("KVM-CPU-029", fixture("KVM-CPU-029", "bad", "strict-node-3.xml"))
    assert numa.actual == "strict nodeset 1,3: node(s) 3 not on this host (nodes 0-1)"
    [pages] = audit("KVM-MEM-012", fixture("KVM-MEM-012", "bad", "one-gib-pages.xml"))
    assert "reserved: 512 x 2 MiB" in pages.actual


# --- 10. two guests writing one disk: through the CLI ----------------------------------------------

def _json_audit(args: list[str], capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    main(["audit", "--format", "json", "--root", str(HOST), "--only", "KVM-STO-023", *args])
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert isinstance(findings, list)
    return findings


def test_one_disk_two_writers_only_where_they_share_a_host(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for f in (HERE / "KVM-STO-023" / "bad" / "clone").iterdir():
        shutil.copy(f, tmp_path / f.name)
    assert _json_audit([str(tmp_path)], capsys) == []  # files from anywhere: not known to share a host
    found = _json_audit(["--assume-this-host", str(tmp_path)], capsys)
    assert sorted(f["target"]["domain"] for f in found) == ["web01", "web02"]  # type: ignore[index]
    (tmp_path / "c.xml").write_text((tmp_path / "b.xml").read_text().replace("<name>web02</name>", "<name>web01</name>"))
    named = _json_audit(["--assume-this-host", str(tmp_path / "a.xml"), str(tmp_path / "c.xml")], capsys)
    assert named[0]["actual"] == f"/dev/vg0/web01 writable, also written by web01 ({tmp_path / 'c.xml'})"
    assert all(f["actual"] == "/dev/vg0/web01 writable, also written by " + other
               for f, other in zip(sorted(found, key=lambda f: f["target"]["domain"]), ("web02", "web01"), strict=True))  # type: ignore[index]


# --- 11. legacy named CPU models, by their features ------------------------------------------------

@pytest.mark.parametrize(("model", "avx"), [("westmere", False), ("nehalem-ibrs", False), ("opteron_g3", False),
                                            ("conroe", False), ("penryn", False), ("sandybridge-v2", True),
                                            ("opteron_g4", True), ("epyc-rome-v4", True), ("haswell-notsx-ibrs", True)])
def test_models_are_judged_by_their_features(model: str, avx: bool) -> None:
    features = model_features(model)
    assert features is not None and ("avx" in features) is avx


def test_a_legacy_named_model_says_what_it_lacks() -> None:
    [f] = audit("KVM-CPU-001", fixture("KVM-CPU-001", "bad", "westmere.xml"))
    assert f.actual == "westmere: a legacy named model (AES, SSE4.2; no AVX)"


# --- 12. RHEL machine types ------------------------------------------------------------------------

@pytest.mark.parametrize(("machine", "single"), [
    ("pc-q35-rhel8.3.0", True), ("pc-q35-rhel8.0.0", True), ("pc-i440fx-rhel7.6.0", True), ("pc-q35-rhel7.6.0", True),
    ("pseries-rhel8.2.0", True), ("pc-q35-rhel8.4.0", False), ("pc-q35-rhel9.4.0", False),
    ("pc-q35-5.1", True), ("pc-q35-5.2", False), ("q35", None), ("pc-q35-suse15.1", None),
])
def test_machine_types_single_queue_table(machine: str, single: bool | None) -> None:
    assert single_queue_machine(machine) is single


# --- 15. writethrough where the device refuses O_DIRECT --------------------------------------------

def test_writethrough_fallback_is_reported_with_advice_that_none_will_not_start() -> None:
    [f] = audit("KVM-STO-002", fixture("KVM-STO-002", "bad", "block-no-odirect-fallback.xml"))
    assert (f.severity, f.confidence, f.fix.kind, f.fix.safe) == (Severity.HIGH, "likely", "manual", False)
    assert "would not start" in f.fix.description
    [plain] = audit("KVM-STO-002", fixture("KVM-STO-002", "bad", "writethrough.xml"))
    assert (plain.fix.kind, plain.actual) == ("xml", "writethrough")


def test_fix_leaves_the_fallback_disk_on_writethrough(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    vm = tmp_path / "vm.xml"
    vm.write_bytes((HERE / "KVM-STO-002" / "bad" / "block-no-odirect-fallback.xml").read_bytes())
    main(["fix", str(vm), "--root", str(HOST), "--patch"])
    out = capsys.readouterr().out
    assert "cache='none'" not in out
    assert "cache='writethrough' io='threads'" in vm.read_text()
