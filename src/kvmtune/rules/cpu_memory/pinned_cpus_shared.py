from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule, RunRule
from kvmtune.domain.cputune import cpu_layout
from kvmtune.host.parsers import format_cpu_list

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class PinnedCpusShared(RunRule):
    id = "KVM-CPU-020"
    slug = "guests-pinned-to-same-cpus"
    topic = "vcpu-pinning"
    severity = Severity.MEDIUM
    title = "Two guests have vCPUs pinned to the same host CPUs"
    why = (
        "Pinning promises a vCPU a physical CPU of its own. When a second guest is pinned to the same CPUs the "
        "two share them like unpinned guests would, but the scheduler may no longer move either one to an idle "
        "CPU: both lose, and the latency the pinning was for is gone. Nova's dedicated CPU policy and Proxmox's "
        "affinity setting hand out each host CPU once."
    )
    fix_kind = "manual"
    fix_description = (
        "Give each pinned guest its own host CPUs (<vcpupin cpuset>), or let the guests that may share float "
        "(remove their <vcpupin>). Not automatic: which guest moves, and where, depends on the host's CPU plan."
    )
    fix_safe = False
    references = (
        "libvirt formatdomain 'CPU Tuning': vcpupin, <vcpu cpuset>",
        "OpenStack Nova hw:cpu_policy=dedicated (each pinned vCPU gets a host CPU of its own)",
        "RHEL 9 Optimizing virtual machine performance: vCPU pinning",
    )

    def check_run(self, guests: list[Guest], ctx: AuditContext) -> Iterator[Finding]:
        # linear in the guests (issue 38): guests pinned to the same set of host CPUs (clones) form one group,
        # the groups are indexed by host CPU, and each guest is compared with the groups that share a CPU
        # with it, not with every other guest
        pinned: list[tuple[Guest, _Group]] = []
        groups: dict[frozenset[int], _Group] = {}
        for g in guests:
            layout = cpu_layout(g) if g.vcpu_pinned else None
            if layout is not None and layout.vcpupins:
                cpus = frozenset(layout.vcpu_cpus)
                group = groups.get(cpus)
                if group is None:
                    group = groups[cpus] = _Group(cpus)
                group.add(g, len(pinned))
                pinned.append((g, group))
        by_cpu: dict[int, list[_Group]] = defaultdict(list)
        for group in groups.values():
            group.seal()
            for cpu in group.cpus:
                by_cpu[cpu].append(group)
        for guest, group in pinned:
            clashes = 0  # the other guests (by another name) pinned to one of this guest's CPUs
            stopped = 0  # those of them not running
            shared: set[int] = set()
            first: list[tuple[str, int]] = []  # candidates for the five names shown
            for other, common in group.overlaps(by_cpu):
                n = other.count_not_named(guest.name)
                if not n:
                    continue
                clashes += n
                stopped += other.stopped_not_named(guest.name)
                shared |= common
                first += other.first_not_named(guest.name, 5)
            if not clashes:
                continue
            # by name (then as listed): the finding reads the same whichever order the guests were listed in
            first.sort()
            names = ", ".join(name for name, _ in first[:5]) + (f" and {clashes - 5} more" if clashes > 5 else "")
            both_running = guest.active and not stopped
            yield self.finding(
                target=GuestRule.target(guest, "cputune"),
                actual=f"vCPUs pinned to CPUs {format_cpu_list(shared)}, also pinned to by {names}",
                expected="each host CPU pinned to by one guest",
                evidence="/domain/cputune/vcpupin/@cpuset",
                source=guest.origin,
                confidence="certain" if both_running else "possible",
            )


class _Group:
    """The pinned guests whose vCPUs may run on exactly the same host CPUs."""

    def __init__(self, cpus: frozenset[int]) -> None:
        self.cpus = cpus
        self.keys: list[tuple[str, int]] = []  # (name, place in the run), sorted once sealed
        self.names: list[str] = []  # the keys' names, for bisect
        self.by_name: Counter[str] = Counter()
        self.stopped = 0
        self.stopped_by_name: Counter[str] = Counter()
        self._overlaps: list[tuple[_Group, frozenset[int]]] | None = None

    def add(self, guest: Guest, place: int) -> None:
        self.keys.append((guest.name, place))
        self.by_name[guest.name] += 1
        if not guest.active:
            self.stopped += 1
            self.stopped_by_name[guest.name] += 1

    def seal(self) -> None:
        self.keys.sort()
        self.names = [name for name, _ in self.keys]

    def overlaps(self, by_cpu: dict[int, list[_Group]]) -> list[tuple[_Group, frozenset[int]]]:
        """The groups (this one included) pinned to one of this group's CPUs, with the CPUs in common."""
        if self._overlaps is None:
            seen: dict[int, _Group] = {}
            for cpu in self.cpus:
                for other in by_cpu[cpu]:
                    seen.setdefault(id(other), other)
            self._overlaps = [(other, self.cpus & other.cpus) for other in seen.values()]
        return self._overlaps

    def count_not_named(self, name: str) -> int:
        return len(self.keys) - self.by_name[name]

    def stopped_not_named(self, name: str) -> int:
        return self.stopped - self.stopped_by_name[name]

    def first_not_named(self, name: str, count: int) -> list[tuple[str, int]]:
        """The first ``count`` keys whose name is not ``name`` (the keys of one name lie together)."""
        lo, hi = bisect_left(self.names, name), bisect_right(self.names, name)
        return self.keys[: min(lo, count)] + self.keys[hi : hi + count]
