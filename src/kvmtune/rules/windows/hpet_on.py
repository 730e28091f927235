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


class HpetOn(GuestRule):
    id = "KVM-WIN-003"
    slug = "windows-hpet-on"
    topic = "guest-clock"
    severity = Severity.LOW
    title = "Windows guest with the emulated HPET left on"
    why = (
        "With an HPET present Windows may use it as its clock source and interrupt timer; every access is "
        "emulated in QEMU, and an idle Windows guest then burns host CPU. virt-manager and libosinfo remove it "
        "(present='no') for Windows guests, which then use hypervclock."
    )
    fix_kind = "xml"
    fix_description = "<clock><timer name='hpet' present='no'/></clock> (guest restart)."
    fix_safe = True
    references = (
        "libvirt formatdomain 'Time keeping': timer name='hpet' present",
        "virt-manager/libosinfo defaults for Windows: hpet present='no'",
        "RHEL 9 Optimizing virtual machine performance: Windows guest timers",
    )
    verify = NoExperiment("the HPET's cost is a Windows guest's timer exits; the probe guest is Linux, which does not "
                          "use the HPET that way")

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        hint = hyperv_hint(guest)
        if hint is None:
            return
        el = timer(guest, "hpet")
        if el is not None and el.get("present") == "no":
            return
        finding = self.finding(
            target=self.target(guest, "clock:hpet"),
            actual=("hpet present='yes'" if el is not None else "hpet not disabled (QEMU's default is on)")
            + f" (Windows by {hint.reason})",
            expected="<timer name='hpet' present='no'/>",
            evidence="/domain/clock/timer[@name='hpet']",
            source=guest.origin,
            confidence=hint.confidence,
        )
        if (guess := guessed(hint)) is not None:
            finding.extra["guessed"] = guess
        yield finding
