from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.rules.host import HostFactsRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


class VcpuOvercommit(HostFactsRule):
    id = "KVM-HST-019"
    slug = "vcpu-overcommit-high"
    topic = "vcpu-overcommit"
    severity = Severity.MEDIUM
    title = "Running guests' vCPUs far outnumber the host's CPUs"
    why = (
        "Every vCPU is a host thread; beyond a few per CPU they queue for run time, and a vCPU preempted while "
        "holding a guest lock stalls the other vCPUs of its guest. Seed 000 advises allocating the minimum "
        "vCPUs a guest needs; OpenStack Nova lowered its default CPU allocation ratio from 16 to 4 in 2022."
    )
    fix_kind = "manual"
    fix_description = "Give guests fewer vCPUs or spread them over more hosts (one guest above the host's CPUs: KVM-CPU-002)."
    references = (
        "seed:000 (Best practice: allocate the minimum amount of processor resources)",
        "nova/conf/compute.py: initial_cpu_allocation_ratio 4.0 (was 16.0 until commit 1260cdd492, 2022)",
    )

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        cpus = facts.cpu_count
        if not cpus or not facts.guests:
            return
        ratio = facts.guest_vcpus / cpus
        limit = ctx.thresholds.vcpu_overcommit  # default 4.0: nova initial_cpu_allocation_ratio since 2022
        if ratio > limit:
            yield self.finding(
                target=self.at(ctx, "cpu"),
                actual=f"{facts.guest_vcpus} vCPUs in {len(facts.guests)} guests on {cpus} CPUs ({ratio:.1f}:1)",
                expected=f"≤ {limit:g}:1",
                evidence="-smp of running QEMU processes (/proc/*/cmdline), /sys/devices/system/cpu/online",
            )
