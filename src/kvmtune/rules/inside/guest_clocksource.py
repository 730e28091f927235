from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest

# read without leaving the guest (vDSO): kvm-clock, and tsc where the TSC is invariant
FAST = frozenset({"kvm-clock", "tsc"})


class GuestClocksource(GuestRule):
    id = "KVM-INS-002"
    slug = "guest-clocksource"
    topic = "guest-clock"
    judges_only = "inside"
    severity = Severity.MEDIUM
    title = "The guest keeps time with an emulated clock (hpet, acpi_pm): every clock read exits to QEMU"
    why = (
        "kvm-clock (and tsc on an invariant-TSC host) are read from memory through the vDSO, so "
        "gettimeofday/clock_gettime never leave the guest. hpet and acpi_pm are emulated devices: each read is a "
        "VM exit into QEMU, thousands per second for a busy database or a tracing workload."
    )
    fix_kind = "manual"
    fix_description = (
        "Inside the guest: echo kvm-clock > /sys/devices/system/clocksource/clocksource0/current_clocksource, "
        "and find why the kernel left it (dmesg 'clocksource'; a clocksource= boot option). If kvm-clock is not "
        "offered, the host's CPU model hides it (-cpu ...,-kvmclock). kvmtune never writes inside a guest."
    )
    references = (
        "Linux Documentation/virt/kvm/x86/msr.rst: MSR_KVM_SYSTEM_TIME_NEW (kvmclock)",
        "RHEL 9 'Configuring and managing virtualization': 'Optimizing virtual machine performance' (kvm-clock)",
        "Linux Documentation/admin-guide/kernel-parameters.txt: clocksource=",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        inside = guest.inside
        if inside is None or not inside.is_linux or inside.clocksource is None or inside.clocksource in FAST:
            return
        offered = "kvm-clock" in inside.clocksources_available
        if not offered and (guest.virt_type or "").lower() != "kvm":
            return  # under TCG there is no kvm-clock to choose: nothing better to ask for
        yield self.finding(
            target=self.target(guest, "guest-clocksource"),
            actual=inside.clocksource + ("" if offered else " (kvm-clock not offered to the guest)"),
            expected="kvm-clock" if offered else "kvm-clock (offer it: no -kvmclock in the CPU model)",
            evidence=f"guest agent ({inside.via}): /sys/devices/system/clocksource/clocksource0/current_clocksource",
            source=guest.origin,
        )
