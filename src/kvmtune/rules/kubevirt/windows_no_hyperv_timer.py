from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.kubevirt.form import KubevirtForm
from kvmtune.kubevirt.guest import spec_of, windows_reason

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class WindowsNoHypervTimer(GuestRule):
    id = "KVM-KUB-009"
    slug = "kubevirt-windows-no-hyperv-timer"
    topic = "guest-clock"
    severity = Severity.MEDIUM
    title = "KubeVirt Windows VM without the Hyper-V timer: Windows keeps time with emulated timers"
    why = (
        "Without spec.domain.clock.timer.hyperv Windows reads time from emulated timers (the RTC, the PIT, the "
        "HPET), each read a trap into QEMU; an idle Windows guest then costs host CPU, and timer-heavy workloads "
        "are slower. The Hyper-V reference timer is read from shared memory, without an exit."
    )
    fix_kind = "manual"
    fix_description = "KubeVirt: set spec.template.spec.domain.clock.timer.hyperv: {} (restart)."
    fix_safe = True
    kubevirt = KubevirtForm("domain.clock.timer.hyperv", "{}", "with hpet present: false, as KubeVirt's Windows example",
                            setting={})
    references = (
        "KubeVirt user guide, compute/virtual_hardware.md: clock and timers",
        "kubevirt/kubevirt examples/vmi-windows.yaml: clock.timer.hyperv, hpet present false",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        spec = spec_of(guest)
        reason = windows_reason(spec) if spec is not None else None
        if spec is None or reason is None:
            return
        timer: Any = spec.get("domain.clock.timer.hyperv")
        if not isinstance(timer, dict):
            preferred = spec.pref("clock", "preferredTimer")
            timer = preferred.get("hyperv") if isinstance(preferred, dict) else None
        if isinstance(timer, dict) and timer.get("present", True) is not False:
            return
        yield self.finding(
            target=self.target(guest, "clock"),
            actual=f"no clock.timer.hyperv (Windows by {reason})",
            expected="clock.timer.hyperv: {}",
            evidence=spec.path("domain.clock.timer.hyperv"),
            source=guest.origin,
            confidence="likely",
        )
