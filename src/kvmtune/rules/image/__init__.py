"""Image rules (KVM-IMG-NNN): disk image files and devices, read by :mod:`kvmtune.qemu.image`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Target
from kvmtune.audit.rule import ImageRule

if TYPE_CHECKING:
    from collections.abc import Iterable

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.qemu.image import DiskImage


class DiskImageRule(ImageRule):
    """An image rule over :class:`DiskImage` (the engine guards the call)."""

    def check_image(self, image: DiskImage, ctx: AuditContext) -> Iterable[Finding]:
        return self.check_disk_image(image, ctx)

    def check_disk_image(self, image: DiskImage, ctx: AuditContext) -> Iterable[Finding]:
        raise NotImplementedError

    @staticmethod
    def at(ctx: AuditContext, image: DiskImage, device: str | None = None) -> Target:
        # images are always files of this machine, even when --root points at a captured host tree
        return Target(host=ctx.host_name, device=device or image.label)


def size(b: int | float | None) -> str:
    if b is None:
        return "?"
    for unit, div in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(b) >= div:
            return f"{b / div:.1f} {unit}"
    return f"{int(b)} B"
