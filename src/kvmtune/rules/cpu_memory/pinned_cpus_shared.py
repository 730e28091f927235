from __future__ import annotations

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
        pinned: list[tuple[Guest, set[int]]] = []
        for g in guests:
            layout = cpu_layout(g) if g.vcpu_pinned else None
            if layout is not None and layout.vcpupins:
                pinned.append((g, layout.vcpu_cpus))
        for i, (guest, cpus) in enumerate(pinned):
            # by name: the finding reads the same whichever order the guests were listed in (files, libvirt)
            clashes = sorted(((other, cpus & ocpus) for j, (other, ocpus) in enumerate(pinned)
                              if j != i and other.name != guest.name and cpus & ocpus), key=lambda c: c[0].name)
            if not clashes:
                continue
            shared = set().union(*(c for _, c in clashes))
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

