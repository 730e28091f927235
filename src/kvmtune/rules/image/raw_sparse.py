from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.verifyplan import PREALLOC_JOB, BlockExperiment
from kvmtune.rules.image import DiskImageRule, size

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.qemu.image import DiskImage


class RawImageSparse(DiskImageRule):
    id = "KVM-IMG-003"
    slug = "raw-image-sparse"
    topic = "image-preallocation"
    severity = Severity.LOW
    title = "Sparse raw image: space is allocated on first write"
    why = (
        "Seed 000: a sparse file allocates blocks only when the guest writes them, which adds file system "
        "work to first writes, fragments the image, and lets the images promise more space than the file "
        "system has (storage overcommit): when it fills, guests get write errors on a disk that still looks "
        "half empty to them."
    )
    fix_kind = "image"
    fix_description = "fallocate -l SIZE IMAGE (keeps the data) or create with qemu-img create -f raw -o preallocation=falloc."
    fix_safe = True
    references = (
        "seed:000 (Sparse files: allocation on write, over-committed storage when the maximum exceeds free space)",
        "QEMU docs/system/qemu-block-drivers.rst: raw preallocation (falloc, full)",
    )
    verify = BlockExperiment(PREALLOC_JOB, layout={"preallocation": "falloc"}, by="kvmtune fix --images")

    def check_disk_image(self, image: DiskImage, ctx: AuditContext) -> Iterator[Finding]:
        if image.format != "raw" or image.preallocation != "sparse":
            return
        yield self.finding(
            target=self.at(ctx, image),
            actual=f"{size(image.allocated_size)} allocated of {size(image.virtual_size)} virtual "
            f"({(image.allocated_fraction or 0) * 100:.0f} %)",
            expected="fully allocated for write-heavy disks",
            evidence=image.preallocation_evidence,
        )
