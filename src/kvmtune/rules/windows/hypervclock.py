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


class Hypervclock(GuestRule):
    id = "KVM-WIN-002"
    slug = "hypervclock-missing"
    topic = "guest-clock"
    severity = Severity.MEDIUM
    title = "Windows guest without the hypervclock timer"
    why = (
        "hypervclock gives Windows a paravirtual reference TSC page: reading the time costs no VM exit. Without "
        "it Windows falls back to the ACPI PM timer or HPET, each read trapping into QEMU, which shows as high "
        "host CPU for an idle guest; Hyper-V synthetic timers (stimer) also need it."
    )
    fix_kind = "xml"
    fix_description = "<clock><timer name='hypervclock' present='yes'/></clock> (guest restart)."
    fix_safe = True
    references = (
        "libvirt formatdomain 'Time keeping': timer name='hypervclock'",
        "QEMU docs/system/i386/hyperv.rst: hv-time (reference TSC page), needed by hv-stimer",
        "RHEL 9 Optimizing virtual machine performance: Hyper-V enlightenments (hypervclock)",
    )
    verify = NoExperiment("hypervclock is a Windows guest's clock source; the probe guest is Linux")

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        hint = hyperv_hint(guest)
        if hint is None or guest.virt_type not in (None, "kvm"):
            return
        el = timer(guest, "hypervclock")
        if el is not None and el.get("present", "yes") == "yes":
            return
        finding = self.finding(
            target=self.target(guest, "clock:hypervclock"),
            actual=("hypervclock present='no'" if el is not None else "no hypervclock timer")
            + f" (Windows by {hint.reason})",
            expected="<timer name='hypervclock' present='yes'/>",
            evidence="/domain/clock/timer[@name='hypervclock']",
            source=guest.origin,
            confidence=hint.confidence,
        )
        if (guess := guessed(hint)) is not None:
            finding.extra["guessed"] = guess
        yield finding
