from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.rules.common import data_disks, low

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class GuestNeverTrims(GuestRule):
    id = "KVM-INS-005"
    slug = "guest-never-trims"
    topic = "discard"
    judges_only = "inside"
    severity = Severity.LOW
    title = "The host passes discards, but the guest never trims: freed blocks stay allocated on the host"
    why = (
        "discard='unmap' lets a guest's TRIM free space in a thin image or a thin LV, but only a guest that "
        "trims sends any: a periodic fstrim (systemd's fstrim.timer) or file systems mounted with 'discard'. "
        "Without either, deleted files keep their blocks on the host and the image only grows."
    )
    fix_kind = "manual"
    fix_description = (
        "Inside the guest: systemctl enable --now fstrim.timer (weekly; preferred over the 'discard' mount option, "
        "which trims on every delete). kvmtune never writes inside a guest."
    )
    references = (
        "libvirt formatdomain 'Hard drives': driver discard (unmap, ignore)",
        "util-linux fstrim(8) and fstrim.timer",
        "RHEL 9 'Managing storage devices': 'Enabling periodic block discard'",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        inside = guest.inside
        if inside is None or not inside.is_linux or inside.trim_scheduled is not False or inside.discard_mounts:
            return
        passing = [d for d in data_disks(guest, writable=True) if low(d.discard) == "unmap"]
        if not passing:
            return
        yield self.finding(
            target=self.target(guest, passing[0].label),
            actual="discard=unmap on " + ", ".join(d.target for d in passing)
            + "; guest: no fstrim timer or cron job, no file system mounted with discard",
            expected="fstrim.timer enabled in the guest",
            evidence=f"{passing[0].where('discard')}; guest agent ({inside.via}): /proc/mounts, "
            "/etc/systemd/system/timers.target.wants/fstrim.timer, /etc/cron.weekly/fstrim",
            source=guest.origin,
        )
