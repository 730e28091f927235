from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.rules.host import HostFactsRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


class CpuUtilizationHigh(HostFactsRule):
    id = "KVM-HST-018"
    slug = "cpu-utilization-high"
    topic = "cpu-utilization"
    severity = Severity.MEDIUM
    also_severities = (Severity.HIGH,)  # what some findings are raised or lowered to
    title = "Host CPU utilization above the 80 % target"
    why = (
        "Seed 000 targets overall system use at 80 % or lower: the remaining 20 % absorbs bursts, and as use "
        "rises so does the cost of every context switch between vCPU threads, until guests' responsiveness "
        "suffers."
    )
    fix_kind = "manual"
    fix_description = "Move guests to another host, give guests fewer vCPUs, or add CPUs."
    references = (
        "seed:000 (Best practice: target system use at 80 % or lower)",
        "proc(5): /proc/stat cpu line",
    )

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        times = facts.cpu_times
        if times is None:
            return
        busy = times.busy_fraction()
        target = ctx.thresholds.cpu_utilization  # default 0.80: seed 000
        if busy is None or busy < target:
            return
        steal = times.steal / times.total * 100 if times.total else 0.0
        yield self.finding(
            target=self.at(ctx, "cpu"),
            severity=Severity.HIGH if busy >= 0.95 else Severity.MEDIUM,
            actual=f"{busy * 100:.0f} % busy on average since boot"
            + (f" (of which steal {steal:.0f} %)" if steal >= 1 else ""),
            expected=f"≤ {target * 100:g} %",
            evidence="/proc/stat cpu line (user+nice+system+irq+softirq+steal over all counters)",
        )
