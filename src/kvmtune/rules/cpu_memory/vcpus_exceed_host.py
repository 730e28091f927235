from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import NoExperiment

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class VcpusExceedHost(GuestRule):
    id = "KVM-CPU-002"
    slug = "vcpus-exceed-host"
    topic = "vcpu-overcommit"
    judges_only = "on_audited_host"
    severity = Severity.HIGH
    title = "Guest has more vCPUs than the host has online CPUs"
    why = (
        "A guest's vCPUs are host threads; with more of them than host CPUs some are always waiting for a "
        "CPU. Guest kernels assume their CPUs run concurrently: a vCPU holding a spinlock gets preempted and "
        "the others spin on it (lock-holder preemption), TLB shootdowns and RCU wait for descheduled vCPUs, and "
        "soft-lockup warnings follow. The guest ends up slower than with fewer vCPUs, never faster."
    )
    fix_kind = "xml"
    fix_description = "Lower <vcpu> to at most the host's CPU count (better: what the workload uses); hot-plug more if needed."
    fix_safe = False
    references = (
        "seed:000 (allocate the minimum amount of processor resources; target 80 % or lower host use)",
        "nova initial_cpu_allocation_ratio 4.0 across guests, but never one guest above the host's threads",
        "Linux qspinlock/pvqspinlock: over-committed guests with more vCPUs than physical CPUs",
    )
    verify = NoExperiment("more vCPUs than host CPUs cost when all of them run at once (lock holders preempted); the guest "
                          "tier has no all-vCPU load experiment for it")

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        if not guest.on_audited_host:
            return  # a guest from a file or a remote libvirt runs on some other host's CPUs
        host_cpus = ctx.host_cpu_count()
        if not host_cpus or not guest.vcpus or guest.vcpus <= host_cpus:
            return
        yield self.finding(
            target=self.target(guest, "vcpus"),
            actual=f"{guest.vcpus} vCPUs on a host with {host_cpus} online CPUs",
            expected=f"at most {host_cpus} vCPUs",
            evidence=guest.where("vcpus") or "/domain/vcpu",
            source=guest.origin,
            confidence="certain" if guest.origin_kind != "xml" else "likely",
        )
