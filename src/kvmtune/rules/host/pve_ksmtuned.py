from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.host.settings import PVE_KSMTUNED_START
from kvmtune.rules.host import HostFactsRule, gib

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


class PveKsmtuned(HostFactsRule):
    id = "KVM-HST-061"
    slug = "pve-ksmtuned-stopped"
    topic = "ksm"
    severity = Severity.MEDIUM
    title = "A Proxmox VE node's guests near its RAM, and ksmtuned (which starts KSM there) is not running"
    why = (
        "Proxmox VE leaves KSM to ksmtuned, which starts it once less than 20 % of RAM is free; with ksmtuned "
        "stopped, a node whose guests take more than 80 % of RAM never shares pages and goes to swap first."
    )
    fix_kind = "manual"
    fix_description = "Start PVE's KSM daemon: systemctl enable --now ksmtuned (package ksm-control-daemon)."
    fix_safe = True
    references = (
        "Proxmox VE Administration Guide, 'Kernel Samepage Merging (KSM)': ksmtuned starts KSM when more than "
        "80 % of RAM is in use (KSM_THRES_COEF=20)",
        "https://pve.proxmox.com/wiki/Kernel_Samepage_Merging_(KSM)",
    )

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        if not facts.pve_node:
            return
        ratio = facts.memory_ratio
        ksm = facts.ksm
        # past 1.0 KVM-HST-006 (KSM off with overcommit) reports it, naming ksmtuned as the fix
        if ratio is None or not PVE_KSMTUNED_START < ratio <= 1.0 or ksm is None or ksm.running:
            return
        if facts.process_running("ksmtuned"):
            return
        yield self.finding(
            target=self.at(ctx, "ksm"),
            actual=(f"ksmtuned not running, KSM run={ksm.run}; {len(facts.guests)} guest(s) hold "
                    f"{gib(facts.guest_memory_kib)} of {gib(facts.mem_total_kib or 0)} RAM ({ratio:.2f}×)"),
            expected=f"ksmtuned running (it starts KSM above {PVE_KSMTUNED_START:.0%} of RAM in use)",
            evidence="/proc/*/comm (no ksmtuned), /sys/kernel/mm/ksm/run, /proc/meminfo MemTotal, QEMU -m of "
                     "running guests, /etc/pve",
        )
