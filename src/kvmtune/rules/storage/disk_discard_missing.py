from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import DISCARD, BlockExperiment
from kvmtune.proxmox.qmset import PveForm
from kvmtune.rules.common import data_disks, low

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest

THIN_FORMATS = {"qcow2"}
NO_DISCARD_BUS = {"fdc", "sd", "usb"}


class DiskDiscardMissing(GuestRule):
    id = "KVM-STO-010"
    slug = "disk-discard-missing"
    topic = "discard"
    judges_only = "disks"
    severity = Severity.LOW
    title = "Thin qcow2 image without discard='unmap': space the guest frees is never returned"
    why = (
        "A qcow2 image only grows: when the guest deletes files, the clusters stay allocated unless the guest's "
        "TRIM/discard requests are passed down (discard='unmap'). Without it the image creeps towards its full "
        "virtual size, the host filesystem fills, and backups and migrations copy dead blocks."
    )
    fix_kind = "xml"
    fix_description = (
        "Set <driver discard='unmap'/> and run fstrim in the guest (fstrim.timer); detect_zeroes='unmap' "
        "also catches zero writes, at some CPU cost."
    )
    fix_safe = True
    # the same fix as 'qm set' (proxmox/qmset.py)
    pve = PveForm("disk-props", "Hardware > Hard Disk ({}) > Discard", (("discard", "on"),))
    references = (
        "libvirt formatdomain: disk driver discard (since 1.0.6), detect_zeroes (since 2.0.0)",
        "nova [libvirt]hw_disk_discard=unmap",
        "Proxmox qm.adoc: discard (virtio-blk needs guest kernel >= 5.0)",
    )
    verify = BlockExperiment(DISCARD)

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        for disk in data_disks(guest, writable=True):
            if low(disk.format) not in THIN_FORMATS or low(disk.bus) in NO_DISCARD_BUS:
                continue
            if low(disk.discard) == "unmap":
                continue
            yield self.finding(
                target=self.target(guest, disk.label),
                actual=f"discard={low(disk.discard) or 'unset (ignore)'}",
                expected="discard=unmap",
                evidence=disk.where("discard"),
                source=guest.origin,
            )
