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


class DiskFileBacked(GuestRule):
    id = "KVM-STO-013"
    slug = "disk-file-backed"
    topic = "block-vs-file"
    judges_only = "disks"
    severity = Severity.INFO
    title = "Disk is an image file on a host filesystem rather than a block device"
    why = (
        "Every request to an image file also passes through the host filesystem (allocation, metadata, "
        "journal). Seed 000 reports that in IBM's lab tests a block device passed to the guest reached 90 % "
        "or more of bare-metal I/O performance on average, a file on the host only about 70 %. Files are "
        "easier to manage, snapshot and move; the choice is a trade-off, not an error."
    )
    fix_kind = "manual"
    fix_description = (
        "For I/O-critical disks use an LVM logical volume, a partition or a whole disk (<disk type='block'>); "
        "otherwise keep the file raw or preallocated and use cache='none'."
    )
    fix_safe = False
    references = (
        "seed:000 (block device >= 90 % of bare metal vs file about 70 %, IBM lab averages)",
        "libvirt formatdomain: disk type='block' vs type='file'",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        for disk in data_disks(guest, writable=True):
            if low(disk.source_type) != "file":
                continue
            yield self.finding(
                target=self.target(guest, disk.label),
                actual=f"file {disk.source}" if disk.source else "file",
                expected="a block device (LV, partition, disk) for I/O-critical disks",
                evidence=disk.where("source"),
                source=guest.origin,
            )
