from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import NoExperiment
from kvmtune.domain.windows import guessed, hyperv_hint, missing_enlightenments

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class HypervEnlightenments(GuestRule):
    id = "KVM-WIN-001"
    slug = "hyperv-enlightenments-missing"
    topic = "hyperv"
    severity = Severity.MEDIUM
    title = "Windows guest without the Hyper-V enlightenments"
    why = (
        "Windows runs best on a hypervisor that speaks Hyper-V's paravirtual interfaces: relaxed timing, a "
        "virtual APIC, spinlock notification, synthetic interrupts and timers, paravirtual TLB flush and IPIs. "
        "Without them it busy-waits on spinlocks, takes a VM exit for every APIC access and flushes TLBs by IPI "
        "to every vCPU; virt-manager and libosinfo turn them on for every Windows guest."
    )
    fix_kind = "xml"
    fix_description = (
        "Add the missing ones under <features><hyperv mode='custom'> with state='on' (spinlocks retries='8191'); "
        "or, on a libvirt that has it, <hyperv mode='passthrough'/> for all the host offers. Needs a guest "
        "restart; stimer also wants the hypervclock timer (KVM-WIN-002)."
    )
    fix_safe = True
    references = (
        "libvirt formatdomain 'Hypervisor features': hyperv relaxed, vapic, spinlocks (retries >= 4095), vpindex, "
        "runtime, synic, stimer, reset, frequencies, tlbflush, ipi; mode='passthrough'",
        "QEMU docs/system/i386/hyperv.rst: hv-relaxed, hv-vapic, hv-spinlocks, hv-vpindex, hv-synic, hv-stimer, "
        "hv-tlbflush, hv-ipi, hv-frequencies, hv-reset",
        "RHEL 9 Optimizing virtual machine performance: 'Enabling Hyper-V enlightenments' for Windows guests",
        "Proxmox VE: ostype win* enables the Hyper-V enlightenments",
    )
    verify = NoExperiment("Hyper-V enlightenments act inside a Windows guest (its timers, spinlocks, IPIs); the "
                          "probe guest is Linux")

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        hint = hyperv_hint(guest)
        if hint is None or guest.virt_type not in (None, "kvm"):
            return
        missing = missing_enlightenments(guest)
        if not missing:
            return
        finding = self.finding(
            target=self.target(guest, "features:hyperv"),
            actual=f"missing or off: {', '.join(missing)} (Windows by {hint.reason})",
            expected="all on, or <hyperv mode='passthrough'/>",
            evidence="/domain/features/hyperv",
            source=guest.origin,
            confidence=hint.confidence,
        )
        if (guess := guessed(hint)) is not None:
            finding.extra["guessed"] = guess
        yield finding
