from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.domain.windows import linux_hint

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class LinuxRtcLocaltime(GuestRule):
    id = "KVM-GST-002"
    slug = "linux-rtc-localtime"
    topic = "guest-clock"
    severity = Severity.MEDIUM
    title = "Linux guest with its RTC in local time (clock offset='localtime')"
    why = (
        "Linux keeps the hardware clock in UTC and reads it as UTC at boot unless told otherwise "
        "(/etc/adjtime LOCAL). With offset='localtime' the emulated RTC runs in the host's zone: the guest boots "
        "hours off, logs and file times are wrong until NTP steps the clock, and the RTC jumps by an hour at each "
        "daylight-saving change. libvirt documents localtime for Windows guests; UTC is the default for a reason."
    )
    fix_kind = "manual"
    fix_description = (
        "Set <clock offset='utc'/> (on a command line -rtc base=utc) and restart the guest; a guest set to read "
        "its RTC as local time (timedatectl set-local-rtc 1) needs set-local-rtc 0 as well."
    )
    fix_safe = False
    references = (
        "libvirt formatdomain 'Time keeping': offset utc (default) and localtime (for Windows guests)",
        "hwclock(8) and /etc/adjtime: Linux expects the RTC in UTC; local time breaks at DST changes",
        "timedatectl(1) set-local-rtc: maintaining the RTC in the local timezone 'will create various problems "
        "with time zone changes and daylight saving adjustments'",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        if guest.clock_offset != "localtime":
            return
        hint = linux_hint(guest)
        if hint is None:
            return  # only a guest known to be Linux: Windows wants local time
        yield self.finding(
            target=self.target(guest, "clock"),
            actual=f"clock offset='localtime' (Linux by {hint.reason})",
            expected="offset='utc'",
            evidence=guest.where("clock") or "/domain/clock/@offset",
            source=guest.origin,
            confidence=hint.confidence,
        )
