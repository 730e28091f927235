"""Issue 38: the three run rules that look at every guest of a run at once (KVM-CPU-020 pinned CPUs shared,
KVM-STO-023 a disk written by two guests, KVM-NET-006 a duplicate MAC) index the guests once per run instead
of comparing every guest with every other. Their findings must stay exactly what the pairwise code said
(same order, text, evidence, targets): the pairwise code is kept here, as the reference, and both run on
fleets where many guests share CPUs, disks and MACs; and the work they do must grow linearly with the
guests, counted in Python bytecodes executed (not timed)."""

from __future__ import annotations

import random
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from kvmtune.audit.context import AuditContext
from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule, RunRule
from kvmtune.domain.cputune import cpu_layout
from kvmtune.domain.xml import guest_from_tree, parse_xml_bytes
from kvmtune.host.parsers import format_cpu_list
from kvmtune.host.root import HostRoot
from kvmtune.rules import common
from kvmtune.rules.common import data_disks
from kvmtune.rules.cpu_memory import pinned_cpus_shared
from kvmtune.rules.cpu_memory.pinned_cpus_shared import PinnedCpusShared
from kvmtune.rules.network import duplicate_mac
from kvmtune.rules.network.duplicate_mac import DuplicateMac, normalise_mac
from kvmtune.rules.storage import disk_written_by_two_guests
from kvmtune.rules.storage.disk_written_by_two_guests import DiskWrittenByTwoGuests, disk_key, host_of

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from types import FrameType

    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Disk, Guest, Nic

HOST = HostRoot(str(Path(__file__).parent.parent / "fixtures" / "hosts" / "rules-default"))


# --- the pairwise code the rules had before issue 38: the reference --------------------------------------

class NaivePinned(PinnedCpusShared):
    def check_run(self, guests: list[Guest], ctx: AuditContext) -> Iterator[Finding]:
        pinned: list[tuple[Guest, set[int]]] = []
        for g in guests:
            layout = cpu_layout(g) if g.vcpu_pinned else None
            if layout is not None and layout.vcpupins:
                pinned.append((g, layout.vcpu_cpus))
        for i, (guest, cpus) in enumerate(pinned):
            clashes = sorted(((other, cpus & ocpus) for j, (other, ocpus) in enumerate(pinned)
                              if j != i and other.name != guest.name and cpus & ocpus), key=lambda c: c[0].name)
            if not clashes:
                continue
            shared: set[int] = set().union(*(c for _, c in clashes))
            names = ", ".join(o.name for o, _ in clashes[:5]) + (f" and {len(clashes) - 5} more"
                                                                 if len(clashes) > 5 else "")
            both_running = guest.active and all(o.active for o, _ in clashes)
            yield self.finding(
                target=GuestRule.target(guest, "cputune"),
                actual=f"vCPUs pinned to CPUs {format_cpu_list(shared)}, also pinned to by {names}",
                expected="each host CPU pinned to by one guest",
                evidence="/domain/cputune/vcpupin/@cpuset",
                source=guest.origin,
                confidence="certain" if both_running else "possible",
            )


class NaiveDisk(DiskWrittenByTwoGuests):
    def check_run(self, guests: list[Guest], ctx: AuditContext) -> Iterator[Finding]:
        writers: dict[tuple[str, str], dict[tuple[str, ...], tuple[Guest, Disk]]] = defaultdict(dict)
        for guest in guests:
            host = host_of(guest)
            if host is None:
                continue
            for disk in data_disks(guest, writable=True):
                key = disk_key(disk)
                if key is not None and not disk.shareable:
                    writers[(host, key)].setdefault(guest.identity, (guest, disk))
        for (_host, key), by_id in sorted(writers.items()):
            if len(by_id) < 2:
                continue
            users = sorted(by_id.values(), key=lambda gd: (gd[0].name, gd[0].origin))
            names = Counter(g.name for g, _ in users)
            for guest, disk in users:
                others = [g.name if names[g.name] == 1 else f"{g.name} ({g.origin})" for g, _ in users if g is not guest]
                shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
                running = [g for g, _ in users if g.active]
                yield self.finding(
                    target=GuestRule.target(guest, disk.label),
                    actual=f"{key} writable, also written by {shown}",
                    expected="a disk of its own (or <shareable/> in every guest, for a cluster file system)",
                    evidence=disk.where("source"),
                    source=guest.origin,
                    severity=Severity.CRITICAL if len(running) >= 2 else Severity.HIGH,
                )


class NaiveMac(DuplicateMac):
    def check_run(self, guests: list[Guest], ctx: AuditContext) -> Iterator[Finding]:
        users: dict[str, dict[tuple[str, ...], list[tuple[Guest, Nic]]]] = defaultdict(lambda: defaultdict(list))
        for guest in guests:
            for nic in guest.nics:
                mac = normalise_mac(nic.mac)
                if mac is not None and not nic.teaming:
                    users[mac][guest.identity].append((guest, nic))
        seen: set[tuple[tuple[str, ...], str, int]] = set()
        for mac, by_id in users.items():
            ids = sorted(by_id)
            within = {ident for ident, pairs in by_id.items() if self._same_guest_twice(pairs)}
            if len(ids) < 2 and not within:
                continue
            labels = self._labels({ident: by_id[ident][0][0] for ident in ids})
            for ident in ids:
                others = [labels[i] for i in ids if i != ident]
                pairs = by_id[ident]
                if not others and ident not in within:
                    continue
                for guest, nic in pairs:
                    key = (ident, mac, nic.index)
                    if key in seen:
                        continue
                    seen.add(key)
                    what = []
                    if others:
                        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
                        what.append(f"also used by {shown}")
                    if ident in within:
                        what.append("used by another NIC of this guest")
                    yield self.finding(
                        target=GuestRule.target(guest, nic.label),
                        actual=f"{mac} (not unique)",
                        expected="a MAC address unique to this NIC",
                        evidence=nic.where("mac"),
                        source=guest.origin,
                        summary=f"MAC {mac} is not unique: {'; '.join(what)}",
                    )


# --- fleets ------------------------------------------------------------------------------------------------

def guest(name: str, origin: str, *, uuid: str | None = None, cpus: list[str] = (),  # type: ignore[assignment]
          disks: list[tuple[str, str, bool]] = (), macs: list[str] = (),  # type: ignore[assignment]
          active: bool | None = None, here: bool = True) -> Guest:
    """A domain from XML: ``cpus`` one cpuset per vCPU pin, ``disks`` (type, source, shareable)."""
    pins = "".join(f"<vcpupin vcpu='{i}' cpuset='{c}'/>" for i, c in enumerate(cpus))
    body = [f"<name>{name}</name>", f"<uuid>{uuid}</uuid>" if uuid else "", f"<vcpu>{max(len(cpus), 1)}</vcpu>",
            f"<cputune>{pins}</cputune>" if pins else "", "<devices>"]
    for i, (kind, source, shareable) in enumerate(disks):
        attr = "file" if kind == "file" else "dev"
        body.append(f"<disk type='{kind}' device='disk'><source {attr}='{source}'/>"
                    f"<target dev='vd{chr(97 + i)}' bus='virtio'/>{'<shareable/>' if shareable else ''}</disk>")
    body += [f"<interface type='bridge'><mac address='{m}'/><source bridge='br0'/></interface>" for m in macs]
    body.append("</devices>")
    xml = f"<domain type='kvm'>{''.join(body)}</domain>"
    g = guest_from_tree(parse_xml_bytes(xml.encode(), origin), origin)
    g.active = active
    g.on_audited_host = here
    return g


def random_fleet(rng: random.Random, size: int) -> list[Guest]:
    """Few names, CPU sets, disks and MACs for many guests, so that three, four, ten guests share one; some
    guests listed twice (same UUID, from the same file or another), some with the same name in two files."""
    cpusets = ["0", "1", "0-1", "2-3", "3", "4-7", "5", "0,4", "6-7,^7", "8"]
    paths = [("file", "/var/lib/libvirt/images/a.qcow2", False), ("file", "/var/lib/libvirt/images/../images/a.qcow2", False),
             ("block", "/dev/vg/lv1", False), ("block", "/dev/vg/lv1", True), ("file", "/srv/b.raw", False),
             ("file", "relative.img", False)]
    macs = ["52:54:00:00:00:01", "52-54-00-00-00-01", "52:54:00:00:00:02", "52:54:00:AA:bb:03", "52:54:00:00:00:04"]
    fleet: list[Guest] = []
    for i in range(size):
        if fleet and rng.random() < 0.15:  # the same guest again: from the same file, or from another source
            twin = rng.choice(fleet)
            origin = twin.origin if rng.random() < 0.5 else f"other{rng.randrange(3)}.xml"
            name, uuid = twin.name, twin.uuid
        else:
            name, origin = f"vm{rng.randrange(max(size // 3, 2)):03d}", f"f{rng.randrange(4)}.xml"
            uuid = f"00000000-0000-4000-8000-{i:012d}" if rng.random() < 0.7 else None
        fleet.append(guest(
            name, origin, uuid=uuid,
            cpus=[rng.choice(cpusets) for _ in range(rng.choice([0, 0, 1, 2, 3]))],
            disks=[rng.choice(paths) for _ in range(rng.choice([0, 1, 1, 2]))],
            macs=[rng.choice(macs) for _ in range(rng.choice([0, 1, 1, 2]))],
            active=rng.choice([True, True, False, None]), here=rng.random() < 0.85))
    return fleet


def clones(count: int) -> list[Guest]:
    """``count`` clones of one pinned guest: one CPU set, one disk, one MAC, all shared by all."""
    return [guest(f"clone{i:05d}", "fleet.xml", uuid=f"00000000-0000-4000-8000-{i:012d}", cpus=["2-3", "3"],
                  disks=[("file", "/var/lib/libvirt/images/golden.qcow2", False)], macs=["52:54:00:12:34:56"],
                  active=i % 7 != 0) for i in range(count)]


def run(rule: RunRule, guests: list[Guest]) -> list[Finding]:
    return list(rule.check_run(guests, AuditContext(host=HOST)))


RULES: list[tuple[RunRule, RunRule]] = [(PinnedCpusShared(), NaivePinned()), (DiskWrittenByTwoGuests(), NaiveDisk()),
                                        (DuplicateMac(), NaiveMac())]


@pytest.mark.parametrize(("rule", "naive"), RULES, ids=lambda r: r.id)
@pytest.mark.parametrize("seed", range(12))
def test_findings_match_the_pairwise_reference_on_random_fleets(rule: RunRule, naive: RunRule, seed: int) -> None:
    fleet = random_fleet(random.Random(seed), 20 + 15 * seed)
    expected = run(naive, fleet)
    assert expected, "the fleet gives the rule something to find"
    assert run(rule, fleet) == expected
    assert run(rule, fleet[::-1]) == run(naive, fleet[::-1])


@pytest.mark.parametrize(("rule", "naive"), RULES, ids=lambda r: r.id)
def test_three_or_more_sharing_one_and_a_guest_listed_twice(rule: RunRule, naive: RunRule) -> None:
    assert run(rule, clones(12)) == run(naive, clones(12))  # twelve share one: each names five "and 6 more"
    fleet = clones(9)
    fleet.append(fleet[3])  # the same object twice in the run
    fleet.append(guest("clone00004", "process:4242", uuid=fleet[4].uuid, cpus=["2-3"],  # read from its process too
                       disks=[("file", "/var/lib/libvirt/images/golden.qcow2", False)], macs=["52:54:00:12:34:56"]))
    fleet.append(guest("clone00001", "elsewhere.xml", cpus=["3"], macs=["52:54:00:12:34:56", "52:54:00:12:34:56"],
                       disks=[("file", "/var/lib/libvirt/images/golden.qcow2", False)]))  # a name shared by two guests
    fleet.append(guest("solo", "solo.xml", cpus=["9"], disks=[("file", "/solo.img", False)], macs=["52:54:00:99:99:99"]))
    found = run(rule, fleet)
    assert found == run(naive, fleet)
    assert len(found) >= 9
    assert not any(f.target.domain == "solo" for f in found)
    assert any(" and " in f.actual + f.summary and "more" in f.actual + f.summary for f in found)


# --- linear work -------------------------------------------------------------------------------------------

def bytecodes(call: Callable[[], Any], files: set[str]) -> int:
    """How many Python bytecodes run in code from ``files`` while ``call`` runs (deterministic, not a time)."""
    count = 0

    def local(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal count
        if event == "opcode":
            count += 1
        return local

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        if frame.f_code.co_filename in files:
            frame.f_trace_opcodes = True
            return local
        return None

    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(old)
    return count


MODULES = {PinnedCpusShared: pinned_cpus_shared, DiskWrittenByTwoGuests: disk_written_by_two_guests, DuplicateMac: duplicate_mac}


def work(rule: RunRule, guests: list[Guest]) -> int:
    module = next(m for cls, m in MODULES.items() if isinstance(rule, cls))
    files = {module.__file__, common.__file__, type(rule).check_run.__code__.co_filename}
    return bytecodes(lambda: run(rule, guests), {f for f in files if f})


@pytest.mark.parametrize("rule", [r for r, _ in RULES], ids=lambda r: r.id)
def test_work_grows_linearly_with_guests_that_all_share(rule: RunRule) -> None:
    small, large = clones(500), clones(2000)
    assert len(run(rule, large)) == 2000  # every clone is named, with "and 1994 more"
    ratio = work(rule, large) / work(rule, small)
    assert ratio < 4.6, f"4x the guests took {ratio:.1f}x the bytecodes (quadratic would be 16x)"


@pytest.mark.parametrize("naive", [n for _, n in RULES], ids=lambda r: r.id)
def test_the_work_count_catches_the_pairwise_code(naive: RunRule) -> None:
    ratio = work(naive, clones(400)) / work(naive, clones(100))
    assert ratio > 8, f"the pairwise reference took {ratio:.1f}x the bytecodes for 4x the guests"
