from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.verifyplan import HostFixExperiment
from kvmtune.host.settings import KSM_NOT_OVERCOMMITTED
from kvmtune.rules.host import HostFactsRule, gib

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


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
        "Proxmox VE Administration Guide, 'Kernel Samepage Merging (KSM)': ksmtuned (ksm-control-daemon) starts "
        "and stops KSM; to disable it: systemctl disable --now ksmtuned, then echo 2 > /sys/kernel/mm/ksm/run "
        "(https://pve.proxmox.com/wiki/Kernel_Samepage_Merging_(KSM))",
    )
    verify = HostFixExperiment()

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        ksm = facts.ksm
        ratio = facts.memory_ratio
        if ksm is None or not ksm.running or not facts.guests or ratio is None or ratio >= KSM_NOT_OVERCOMMITTED:
            return
        pve = facts.ksmtuned_manages_ksm()
        coef = facts.ksmtuned_thres_coef
        if pve and ratio >= 1 - coef / 100:
            return  # ksmtuned runs KSM by design once the guests' memory comes within KSM_THRES_COEF % of RAM
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
            expected=(f"KSM started by ksmtuned only under memory pressure (KSM_THRES_COEF={coef})" if pve
                      else "run=0 (KSM off) unless guests' memory exceeds RAM"),
            evidence="/sys/kernel/mm/ksm/run, /proc/meminfo MemTotal, QEMU -m of running guests"
                     + (", /etc/pve, /proc/*/comm (ksmtuned), /etc/ksmtuned.conf" if pve else ""),
            fix_kind="manual" if pve else None,
            fix_description=self._pve_fix(coef) if pve else None,
        )

    @staticmethod
    def _pve_fix(coef: int) -> str:
        """On a PVE node ksmtuned owns ksm/run: writing 0 there is undone at its next check (every minute)."""
        return (f"Proxmox VE's ksmtuned manages KSM here: it started KSM because less than KSM_THRES_COEF={coef} % "
                "of RAM counted as free to it (MemFree + Buffers + Cached; the ZFS ARC counts as used), and it would "
                "start KSM again after an echo 0 > /sys/kernel/mm/ksm/run. To keep KSM for real memory pressure, "
                f"lower KSM_THRES_COEF (now {coef}) in /etc/ksmtuned.conf and systemctl restart ksmtuned; to turn "
                "KSM off on this node as PVE documents it: systemctl disable --now ksmtuned, then "
                "echo 2 > /sys/kernel/mm/ksm/run.")
