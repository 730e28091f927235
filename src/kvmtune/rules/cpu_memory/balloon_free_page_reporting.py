from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import NoExperiment
from kvmtune.domain.windows import os_identity, windows_hint
from kvmtune.kubevirt.form import no_field

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest

# the guest kernel that first reports free pages (virtio_balloon's VIRTIO_BALLOON_F_REPORTING, Linux 5.7)
FIRST_KERNEL = (5, 7)


class BalloonFreePageReporting(GuestRule):
    id = "KVM-MEM-010"
    slug = "balloon-without-free-page-reporting"
    topic = "balloon"
    severity = Severity.LOW
    title = "virtio balloon without free page reporting: memory the guest frees stays with it"
    why = (
        "A balloon only returns memory when someone inflates it. With free page reporting the guest kernel "
        "tells the host which pages it has freed, and the host drops them at once, so an idle guest's RSS "
        "shrinks without any management action; autodeflate lets the guest take balloon pages back before its "
        "OOM killer would run."
    )
    fix_kind = "xml"
    fix_description = (
        "<memballoon model='virtio' freePageReporting='on'> (libvirt 6.9, QEMU 5.1, guest Linux 5.7 or later; "
        "guest restart). Consider autodeflate='on' where the balloon is inflated by hand."
    )
    fix_safe = True
    references = (
        "libvirt formatdomain 'Memory balloon device': freePageReporting (since 6.9.0), autodeflate (since 1.3.1)",
        "QEMU virtio-balloon free-page-reporting property (5.1)",
        "Linux Documentation/mm/free_page_reporting.rst (virtio_balloon reporting since Linux 5.7)",
        "virtio-win kvm-guest-drivers-windows: the Windows balloon driver has no free page reporting",
    )
    kubevirt = no_field("virt-launcher decides free page reporting; a VirtualMachine has no field for it")
    verify = NoExperiment("free page reporting returns guest memory to the host; no speed effect to measure")

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        if guest.memballoon != "virtio" or guest.balloon_free_page_reporting or guest.origin_kind == "cmdline":
            return
        if not _guest_can_report(guest):
            return
        yield self.finding(
            target=self.target(guest, "memballoon"),
            actual="virtio balloon, freePageReporting off"
            + ("" if guest.balloon_autodeflate else ", autodeflate off"),
            expected="freePageReporting='on'",
            evidence=guest.where("memballoon") or "/domain/devices/memballoon",
            source=guest.origin,
        )


def _guest_can_report(guest: Guest) -> bool:
    """Only a Linux guest of 5.7 or later reports free pages: not Windows (virtio-win's balloon driver has
    no such feature), not a BSD, not an older Linux. A guest whose OS nobody states is given the benefit."""
    identity = os_identity(guest)
    if identity is not None:
        return identity.family == "linux" and (identity.kernel is None or identity.kernel >= FIRST_KERNEL)
    hint = windows_hint(guest)
    return hint is None or hint.confidence == "possible"
