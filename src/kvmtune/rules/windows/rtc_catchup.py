from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import NoExperiment
from kvmtune.domain.windows import guessed, hyperv_hint, timer

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class RtcCatchup(GuestRule):
    id = "KVM-WIN-004"
    slug = "windows-rtc-without-catchup"
    topic = "guest-clock"
    severity = Severity.LOW
    title = "Windows guest's RTC does not catch up on missed ticks"
    why = (
        "Windows keeps time by counting RTC interrupts. When the host deschedules the vCPU, ticks are missed "
        "and, unless the RTC re-delivers them (tickpolicy='catchup'), the guest clock falls behind. libvirt's "
        "documentation and virt-manager's Windows defaults use catchup for the RTC."
    )
    fix_kind = "xml"
    fix_description = "<clock><timer name='rtc' tickpolicy='catchup'/></clock> (guest restart)."
    fix_safe = True
    references = (
        "libvirt formatdomain 'Time keeping': timer tickpolicy (delay, catchup, merge, discard)",
        "virt-manager/libosinfo defaults for Windows: rtc tickpolicy='catchup', pit tickpolicy='delay'",
    )
    verify = NoExperiment("RTC catch-up is guest timekeeping, not a speed setting")

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        hint = hyperv_hint(guest)
        if hint is None:
            return
        el = timer(guest, "rtc")
        if el is not None and el.get("tickpolicy") == "catchup":
            return
        policy = el.get("tickpolicy") if el is not None else None
        finding = self.finding(
            target=self.target(guest, "clock:rtc"),
            actual=(f"rtc tickpolicy={policy}" if policy else "rtc without tickpolicy")
            + f" (Windows by {hint.reason})",
            expected="<timer name='rtc' tickpolicy='catchup'/>",
            evidence="/domain/clock/timer[@name='rtc']",
            source=guest.origin,
            confidence=hint.confidence,
        )
        if (guess := guessed(hint)) is not None:
            finding.extra["guessed"] = guess
        yield finding
