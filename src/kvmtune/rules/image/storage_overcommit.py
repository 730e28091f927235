from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.rules.image import DiskImageRule, size

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.qemu.image import DiskImage


class StorageOvercommit(DiskImageRule):
    id = "KVM-IMG-004"
    slug = "storage-overcommit"
    topic = "storage-overcommit"
    severity = Severity.MEDIUM
    also_severities = (Severity.HIGH,)  # what some findings are raised or lowered to
    title = "Images on one file system can grow beyond its free space"
    why = (
        "Seed 000's worked example: four sparse 100 GB images holding 60 GB on a 250 GB file system leave "
        "190 GB free for 340 GB of possible growth. Once the file system is full, guests get I/O errors on "
        "writes to new blocks, usually pausing (libvirt error_policy) or corrupting data in the guest."
    )
    fix_kind = "manual"
    fix_description = (
        "Add space, move images to another file system, or preallocate them (qemu-img convert -o "
        "preallocation=falloc) so the shortfall shows now instead of during a write."
    )
    references = (
        "seed:000 (Sparse files: 4 × 100 GB sparse images using 60 GB on 250 GB)",
        "libvirt formatdomain: disk driver error_policy / rerror_policy",
    )

    def check_disk_image(self, image: DiskImage, ctx: AuditContext) -> Iterator[Finding]:
        fs = image.filesystem
        if fs is None or image.is_block_device:
            return
        same = [i for i in ctx.images if i.filesystem and i.filesystem.dev_id == fs.dev_id]
        if not same or same[0] is not image:
            if same:
                return  # reported once per file system, on its first image
            same = [image]
        promised = sum(i.virtual_size or 0 for i in same)
        used = sum(min(i.allocated_size or 0, i.virtual_size or 0) for i in same)
        growth = promised - used
        if growth <= fs.free:
            return
        sev = Severity.HIGH if fs.size and fs.free < 0.05 * fs.size else Severity.MEDIUM
        yield self.finding(
            target=self.at(ctx, image, f"filesystem:{fs.mountpoint}"),
            severity=sev,
            actual=(
                f"{len(same)} image(s) of {size(promised)} virtual hold {size(used)}; they can grow by "
                f"{size(growth)} but {size(fs.free)} is free on {fs.mountpoint} ({fs.fstype}, {size(fs.size)})"
            ),
            expected=f"free space ≥ possible growth (short by {size(growth - fs.free)})",
            evidence="qemu-img info virtual-size, st_blocks of each image, statvfs " + fs.mountpoint,
        )
