from __future__ import annotations

import re
from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.host.parsers import format_cpu_list, parse_cpu_list, parse_cpu_mask
from kvmtune.host.settings import IRQBALANCE_CONFIGS
from kvmtune.rules.host import HostFactsRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


class IrqbalancePinned(HostFactsRule):
    id = "KVM-HST-045"
    slug = "irqs-on-pinned-cpus"
    topic = "irq-affinity"
    severity = Severity.MEDIUM
    title = "irqbalance spreads device interrupts onto CPUs that guests are pinned to"
    why = (
        "A pinned vCPU owns its physical CPU; every host interrupt delivered there preempts the guest. "
        "irqbalance keeps away only from CPUs it is told about (isolcpus/nohz_full, or its banned list), "
        "which is what tuned's realtime-virtual-host and cpu-partitioning profiles set up."
    )
    fix_kind = "manual"
    fix_description = (
        "IRQBALANCE_BANNED_CPULIST=<pinned CPUs> in /etc/sysconfig/irqbalance (Debian: /etc/default/irqbalance), "
        "then restart irqbalance; or isolate the CPUs (tuned cpu-partitioning). Not automatic: which CPUs are "
        "housekeeping CPUs is the operator's layout, and a banned list that covers every CPU stops irqbalance."
    )
    fix_safe = True
    references = (
        "irqbalance(1): IRQBALANCE_BANNED_CPULIST, isolcpus and nohz_full CPUs are excluded",
        "tuned profiles/realtime-virtual-host and cpu-partitioning: isolated_cores, irqbalance banned CPUs",
        "RHEL 9 Optimizing virtual machine performance: vCPU pinning",
        "Documentation/core-api/irq/irq-affinity.rst: /proc/irq/N/smp_affinity_list",
    )

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        pinned = facts.pinned_cpus
        if not pinned or not facts.process_running("irqbalance"):
            return
        kept_away = facts.cmdline_cpus("isolcpus", "nohz_full") | self._banned(facts)
        exposed = pinned - kept_away
        if not exposed:
            return
        irqs = sorted((irq for irq, cpus in facts.irq_affinity.items() if cpus & exposed), key=int)
        if not irqs:
            return
        shown = ", ".join(irqs[:8]) + (f" and {len(irqs) - 8} more" if len(irqs) > 8 else "")
        yield self.finding(
            target=self.at(ctx, "irq:affinity"),
            actual=f"irqbalance running; IRQs {shown} may fire on pinned CPUs {format_cpu_list(exposed)}",
            expected="pinned CPUs banned from irqbalance or isolated",
            evidence="/proc/irq/*/smp_affinity_list; /proc/<qemu pid>/task/*/status; /proc/cmdline; "
                     + ", ".join(IRQBALANCE_CONFIGS),
        )

    @staticmethod
    def _banned(facts: HostFacts) -> set[int]:
        banned: set[int] = set()
        for path in IRQBALANCE_CONFIGS:
            text = facts.text(path, quiet=True) or ""
            for key, value in re.findall(r"^\s*(IRQBALANCE_BANNED_CPU\w*)\s*=\s*\"?([0-9a-fA-Fx,\-]*)\"?",
                                         text, flags=re.M):
                try:
                    banned |= parse_cpu_list(value) if key.endswith("LIST") else parse_cpu_mask(value)
                except ValueError:
                    facts.problem(path, f"{key}: not a CPU list or mask")
        return banned
