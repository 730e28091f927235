from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.domain.cputune import cpu_layout

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class VcpusPinnedToOneCpu(GuestRule):
    id = "KVM-CPU-028"
    slug = "vcpus-pinned-to-one-cpu"
    topic = "vcpu-pinning"
    judges_only = "vcpu_pinned"
    severity = Severity.MEDIUM
    also_severities = (Severity.HIGH,)
    title = "Several vCPUs of one guest pinned to the same single host CPU"
    why = (
        "A vCPU pinned to one host CPU may run nowhere else. Two vCPUs pinned to the same CPU take turns on it: "
        "the guest believes it has two processors running at once, but only one runs, and a vCPU spinning on a "
        "lock waits for the other one to be scheduled (lock-holder preemption). The guest gets less than it "
        "would with the vCPUs floating. It is almost always a typo in the cpuset list."
    )
    fix_kind = "manual"
    fix_description = (
        "Give each vCPU its own host CPU in <vcpupin vcpu='N' cpuset='…'/> (or pin the vCPUs to a set of "
        "CPUs as large as their number); check the host's free CPUs first."
    )
    fix_safe = False
    references = (
        "libvirt formatdomain 'CPU Tuning': vcpupin cpuset (the host CPUs a vCPU may run on)",
        "OpenStack Nova hw:cpu_policy=dedicated: each guest vCPU gets a host CPU of its own",
        "RHEL 9 Optimizing virtual machine performance: vCPU pinning (one vCPU per physical CPU)",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        layout = cpu_layout(guest) if guest.vcpu_pinned else None
        if layout is None or len(layout.vcpupins) < 2:
            return
        on: dict[int, list[int]] = {}
        for vcpu, cpus in sorted(layout.vcpupins.items()):
            if len(cpus) == 1:
                on.setdefault(next(iter(cpus)), []).append(vcpu)
        crowded = {cpu: vcpus for cpu, vcpus in sorted(on.items()) if len(vcpus) > 1}
        if not crowded:
            return
        shown = "; ".join(f"vCPUs {','.join(map(str, v))} on CPU {c}" for c, v in list(crowded.items())[:4])
        more = f" and {len(crowded) - 4} more CPU(s)" if len(crowded) > 4 else ""
        most = max(len(v) for v in crowded.values())
        yield self.finding(
            target=self.target(guest, "cputune"),
            actual=f"{shown}{more}",
            expected="one vCPU per pinned host CPU",
            evidence="/domain/cputune/vcpupin/@cpuset",
            source=guest.origin,
            severity=Severity.HIGH if most > 2 or len(crowded) * 2 >= len(layout.vcpupins) else Severity.MEDIUM,
        )
