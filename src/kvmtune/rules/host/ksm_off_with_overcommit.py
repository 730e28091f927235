from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.verifyplan import HostFixExperiment
from kvmtune.rules.host import HostFactsRule, gib

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


class KsmOffWithOvercommit(HostFactsRule):
    id = "KVM-HST-006"
    slug = "ksm-off-with-overcommit"
    topic = "ksm"
    severity = Severity.MEDIUM
    title = "Memory is overcommitted but KSM is not running"
    why = (
        "When the guests are promised more memory than the host has, the shortfall comes from page sharing, "
        "ballooning or swap; seed 000 ranks page sharing and ballooning well ahead of swapping."
    )
    fix_kind = "sysfs"
    fix_description = (
        "Start KSM (echo 1 > /sys/kernel/mm/ksm/run, or enable ksmtuned), or give the guests less memory / "
        "enable free page reporting on their balloons."
    )
    fix_safe = True
    references = (
        "seed:000 (Over-commit memory by page sharing or ballooning, not swapping)",
        "Linux Documentation/admin-guide/mm/ksm.rst",
    )
    verify = HostFixExperiment()

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        ratio = facts.memory_ratio
        if ratio is None or ratio <= 1.0:
            return
        ksm = facts.ksm
        if ksm is not None and ksm.running:
            return
        state = "not built into this kernel" if ksm is None else f"run={ksm.run}"
        yield self.finding(
            target=self.at(ctx, "ksm"),
            actual=(
                f"KSM {state}; {len(facts.guests)} guest(s) hold {gib(facts.guest_memory_kib)} "
                f"on {gib(facts.mem_total_kib or 0)} RAM ({ratio:.2f}×)"
            ),
            expected="run=1 (or ksmtuned) while guests' memory exceeds RAM",
            evidence="/sys/kernel/mm/ksm/run, /proc/meminfo MemTotal, QEMU -m of running guests",
        )
