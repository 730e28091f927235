from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.rules.host import HostFactsRule, gib

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


class SwapInUse(HostFactsRule):
    id = "KVM-HST-009"
    slug = "swap-in-use"
    topic = "swap"
    severity = Severity.MEDIUM
    also_severities = (Severity.LOW, Severity.HIGH)  # what some findings are raised or lowered to
    title = "The host is using swap"
    why = (
        "A guest page in host swap turns a memory access into a disk read the guest cannot see or schedule "
        "around; seed 000 ranks swapping last among memory overcommit methods, behind page sharing and "
        "ballooning."
    )
    fix_description = (
        "Give the host more RAM or the guests less (balloon, free page reporting, KSM); after that, swapoff -a && "
        "swapon -a pulls pages back in."
    )
    references = (
        "seed:000 (Swapping: page sharing and ballooning outperform swapping)",
        "tuned throughput-performance / virtual-host: vm.swappiness=10",
    )

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        mem = facts.meminfo
        if not mem or "SwapTotal" not in mem or "SwapFree" not in mem:
            return
        used = mem["SwapTotal"] - mem["SwapFree"]
        total = mem.get("MemTotal", 0)
        if used <= max(64 * 1024, total // 100):
            return
        areas = facts.swaps or []
        zram_only = bool(areas) and all(a.is_zram for a in areas if a.used_kib > 0)
        if zram_only:
            sev = Severity.LOW
        elif used > total // 10:
            sev = Severity.HIGH
        else:
            sev = Severity.MEDIUM
        where = ", ".join(f"{a.filename} {gib(a.used_kib)}" for a in areas if a.used_kib > 0)
        yield self.finding(
            target=self.at(ctx, "swap"),
            severity=sev,
            actual=f"{gib(used)} of swap in use ({used * 100 / total:.1f} % of RAM)" + (f": {where}" if where else "")
            + (" (compressed RAM only)" if zram_only else ""),
            expected="no swap in use on a KVM host",
            evidence="/proc/meminfo SwapTotal/SwapFree, /proc/swaps",
        )
