from __future__ import annotations

from collections.abc import Iterator

from kvmtune.audit.context import AuditContext
from kvmtune.audit.finding import Finding, Severity
from kvmtune.audit.verifyplan import HostFixExperiment
from kvmtune.host.facts import HostFacts
from kvmtune.host.settings import KSM_NOT_OVERCOMMITTED
from kvmtune.rules.host import HostFactsRule, gib


class KsmWithoutOvercommit(HostFactsRule):
    id = "KVM-HST-005"
    slug = "ksm-without-overcommit"
    topic = "ksm"
    severity = Severity.LOW
    also_severities = (Severity.MEDIUM,)  # what some findings are raised or lowered to
    title = "KSM is scanning although the guests' memory fits in RAM"
    why = (
        "ksmd spends CPU comparing pages and breaks transparent huge pages apart to merge them; seed 002 turned "
        "KSM off for exactly that reason when memory was not overcommitted. Without overcommit the memory it "
        "saves is memory nobody needs."
    )
    fix_kind = "sysfs"
    fix_description = (
        "Stop KSM (echo 0 > /sys/kernel/mm/ksm/run, or 2 to also unmerge) and disable ksm/ksmtuned services; "
        "or keep it for specific guests only."
    )
    fix_safe = True
    references = (
        "seed:002 (KSM disabled: CPU cycles and THP break-up without memory overcommit)",
        "seed:000 (KSM: scanning is processor intensive; ksmd can use a whole CPU thread)",
        "RHEL 7 Virtualization Tuning and Optimization Guide §9.4 (disable KSM unless oversubscribing)",
    )
    verify = HostFixExperiment()

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        ksm = facts.ksm
        ratio = facts.memory_ratio
        if ksm is None or not ksm.running or not facts.guests or ratio is None or ratio >= KSM_NOT_OVERCOMMITTED:
            return
        cpu = facts.ksmd_cpu_percent()
        sev = Severity.MEDIUM if cpu is not None and cpu >= 5.0 else Severity.LOW
        cpu_text = f"; ksmd used {cpu:.1f} % of a CPU since boot" if cpu is not None else ""
        yield self.finding(
            target=self.at(ctx, "ksm"),
            severity=sev,
            actual=(
                f"run=1 with {len(facts.guests)} guest(s) holding {gib(facts.guest_memory_kib)} of "
                f"{gib(facts.mem_total_kib or 0)} RAM ({ratio:.2f}×){cpu_text}"
            ),
            expected="run=0 (KSM off) unless guests' memory exceeds RAM",
            evidence="/sys/kernel/mm/ksm/run, /proc/meminfo MemTotal, QEMU -m of running guests",
        )
