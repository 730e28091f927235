from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.rules.host import HostFactsRule, gib

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


class MemoryOvercommit(HostFactsRule):
    id = "KVM-HST-020"
    slug = "memory-overcommit"
    topic = "memory-overcommit"
    severity = Severity.MEDIUM
    also_severities = (Severity.HIGH,)  # what some findings are raised or lowered to
    title = "Running guests are promised more memory than the host has"
    why = (
        "If the guests touch the memory they were given, the host must find it somewhere: KSM, balloons or "
        "swap, and seed 000 ranks swap far behind the other two. OpenStack Nova's default RAM allocation "
        "ratio has been 1.0 since 2022."
    )
    fix_kind = "manual"
    fix_description = (
        "Reduce guests' memory or move guests; if overcommit is intended, run KSM and virtio balloons with "
        "free page reporting and watch swap."
    )
    references = (
        "seed:000 (Over-commit memory by page sharing or ballooning; swapping performs worst)",
        "nova/conf/compute.py: initial_ram_allocation_ratio 1.0 (was 1.5 until 2022)",
    )

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        ratio = facts.memory_ratio
        limit = ctx.thresholds.memory_overcommit  # default 1.0: nova initial_ram_allocation_ratio since 2022
        if ratio is None or ratio <= limit or not facts.guests:
            return
        ksm = facts.ksm
        ksm_state = "KSM off" if ksm is None or not ksm.running else "KSM running"
        mem = facts.meminfo or {}
        swap_used = mem.get("SwapTotal", 0) - mem.get("SwapFree", 0)
        yield self.finding(
            target=self.at(ctx, "memory"),
            severity=Severity.HIGH if ratio > max(1.5, limit * 1.5) else Severity.MEDIUM,
            actual=(
                f"{gib(facts.guest_memory_kib)} in {len(facts.guests)} guests on {gib(facts.mem_total_kib or 0)} "
                f"RAM ({ratio:.2f}×); {ksm_state}; swap used {gib(swap_used)}"
            ),
            expected=f"≤ {limit:.1f}× without KSM/ballooning in place",
            evidence="-m of running QEMU processes (/proc/*/cmdline), /proc/meminfo",
        )
