from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.rules.image import DiskImageRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.qemu.image import DiskImage

FOREIGN = {"vmdk", "vdi", "vpc", "vhdx", "qed", "qcow", "parallels", "cloop", "dmg", "bochs"}


class ImageFormat(DiskImageRule):
    id = "KVM-IMG-001"
    slug = "image-format-unsuited"
    topic = "image-format"
    severity = Severity.MEDIUM
    also_severities = (Severity.LOW, Severity.CRITICAL)  # what some findings are raised or lowered to
    title = "Image format is not raw or a current qcow2, or differs from what the guest declares"
    why = (
        "QEMU's fast, well-tested paths are raw and qcow2 (compat 1.1). Formats of other hypervisors are "
        "there to import images; qcow2 compat 0.10 lacks zero clusters and lazy refcounts. A guest that "
        "declares a format other than the file's either fails to start or, declared raw over a qcow2 file, "
        "sees the qcow2 metadata as its disk."
    )
    fix_kind = "manual"
    fix_description = (
        "qemu-img convert -O qcow2 (or raw) with the guest stopped; qemu-img amend -f qcow2 -o compat=1.1 for "
        "old qcow2; make the guest's <driver type=…> match the file."
        " Not automatic: kvmtune fix --images only preallocates; which format to convert to is the administrator's choice."
    )
    references = (
        "QEMU docs/system/qemu-block-drivers.rst (formats; qcow2 compat=1.1)",
        "seed:003 (raw and preallocated qcow2 as the fast formats)",
        "libvirt formatdomain: disk driver type",
    )

    def check_disk_image(self, image: DiskImage, ctx: AuditContext) -> Iterator[Finding]:
        fmt = image.format
        if fmt is None or image.broken:
            return
        mismatched = [u for u in image.used_by if u.declared_format and u.declared_format != fmt]
        for u in mismatched:
            yield self.finding(
                target=self.at(ctx, image),
                severity=Severity.CRITICAL,
                actual=f"file is {fmt}, guest {u.domain} {u.disk} declares {u.declared_format}",
                expected=f"<driver type='{fmt}'/>",
                evidence=f"qemu-img info format; {u.origin}",
                source=u.origin,
                summary="Guest declares a different format than the image file has",
            )
        if fmt in FOREIGN:
            # a guest declaring the same foreign format is already reported by KVM-STO-008
            if image.used_by and all(u.declared_format == fmt for u in image.used_by):
                return
            yield self.finding(
                target=self.at(ctx, image),
                actual=fmt,
                expected="raw or qcow2",
                evidence="qemu-img info: format",
            )
        elif fmt == "qcow2" and image.compat == "0.10":
            yield self.finding(
                target=self.at(ctx, image),
                severity=Severity.LOW,
                actual="qcow2 compat 0.10 (version 2)",
                expected="qcow2 compat 1.1",
                evidence="qemu-img info: format-specific.data.compat",
                summary="qcow2 image in the old version-2 layout",
                fix_description="qemu-img amend -f qcow2 -o compat=1.1 IMAGE (guest stopped)",
                fix_safe=True,
            )
