from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.rules.image import DiskImageRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.qemu.image import DiskImage


class ImageBroken(DiskImageRule):
    id = "KVM-IMG-010"
    slug = "image-broken"
    topic = "image-format"
    severity = Severity.CRITICAL
    also_severities = (Severity.MEDIUM,)  # what some findings are raised or lowered to
    title = "Disk image is damaged, truncated or missing its backing file"
    why = (
        "QEMU refuses to start a guest on a qcow2 image marked corrupt or missing its backing file; a "
        "truncated image loses whatever its metadata points past the end of the file. A dirty image (not "
        "closed cleanly, without lazy refcounts) needs a refcount repair before it is trusted."
    )
    fix_kind = "manual"
    fix_description = (
        "Copy the image aside, then qemu-img check -r all IMAGE (guest stopped); restore from backup if the "
        "check cannot repair it; point the overlay at its backing file again with qemu-img rebase -u."
        " Not automatic: repairs can lose data and need a backup first."
    )
    references = (
        "QEMU docs/interop/qcow2.txt (incompatible feature bits: dirty, corrupt)",
        "qemu-img(1): check -r, rebase -u",
    )

    def check_disk_image(self, image: DiskImage, ctx: AuditContext) -> Iterator[Finding]:
        t = self.at(ctx, image)
        if image.broken:
            yield self.finding(
                target=t, actual=image.broken, expected="an image qemu-img opens and whose metadata lies inside the file",
                evidence="qemu-img info; qcow2 header, L1/L2 and refcount table offsets against the file length",
            )
        if image.corrupt:
            yield self.finding(
                target=t, actual="qcow2 corrupt bit set", expected="corrupt=false",
                evidence="qemu-img info: format-specific.data.corrupt",
            )
        if image.backing_error:
            yield self.finding(
                target=t, actual=f"backing chain unreadable: {image.backing_error}",
                expected=f"backing file {image.backing_file} present and readable",
                evidence="qemu-img info --backing-chain",
            )
        if image.dirty and not image.in_use and not image.lazy_refcounts:
            yield self.finding(
                target=t, severity=Severity.MEDIUM, actual="dirty flag set while no QEMU uses the image",
                expected="a cleanly closed image", evidence="qemu-img info: dirty-flag",
                summary="qcow2 image was not closed cleanly",
            )
