from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.rules.image import DiskImageRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.qemu.image import DiskImage

DIRECT = ("none", "directsync")


class ImageOnNfsCached(DiskImageRule):
    id = "KVM-IMG-007"
    slug = "nfs-image-cache-mode"
    topic = "nfs-storage"
    severity = Severity.MEDIUM
    title = "Image on NFS used with a cache mode other than none"
    why = (
        "Seed 000 recommends cache none for remote NFS storage: it turns guest I/O into O_DIRECT on the NFS "
        "client, which performs better than the O_SYNC writes of write-through, and keeps the host page cache "
        "from holding stale data of an image that another host may open after a live migration."
    )
    fix_kind = "manual"
    fix_description = (
        "Set <driver cache='none' io='native'/> on the disk (guest restart or hot re-plug)."
        " Not automatic here: kvmtune fix on the guest's definition sets cache='none' (KVM-STO-002/003/005)."
    )
    references = (
        "seed:000 (KVM guest caching modes: cache=none recommended for NFS)",
        "libvirt formatdomain: disk driver cache; migration requires cache=none on shared storage",
    )

    def check_disk_image(self, image: DiskImage, ctx: AuditContext) -> Iterator[Finding]:
        if not image.on_nfs or image.filesystem is None:
            return
        fs = image.filesystem
        for u in image.used_by:
            if u.cache in DIRECT:
                continue
            yield self.finding(
                target=self.at(ctx, image),
                actual=f"{fs.fstype} {fs.device}; {u.domain} {u.disk} uses cache={u.cache or 'default (writeback)'}",
                expected="cache=none",
                evidence=f"/proc/mounts ({fs.mountpoint}), {u.origin}",
                source=u.origin,
            )
