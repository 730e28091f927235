from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import CACHE_JOB, BlockExperiment
from kvmtune.proxmox.qmset import CACHE_NONE
from kvmtune.rules.common import NO_BLOCK_LAYER, data_disks, is_passthrough_lun, low

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class DiskCacheDirectsync(GuestRule):
    id = "KVM-STO-014"
    slug = "disk-cache-directsync"
    topic = "disk-cache"
    judges_only = "disks"
    severity = Severity.MEDIUM
    title = "Disk uses cache='directsync': every write waits for the device, guest flushes are redundant"
    why = (
        "directsync opens the image with O_DIRECT like cache='none' but also tells the guest its disk has no "
        "write cache, so QEMU completes each write only once the device has it on stable storage (O_DSYNC "
        "semantics). A guest that sends its own flushes, which every current guest does, pays for one forced "
        "sync per write instead of one per flush."
    )
    fix_kind = "xml"
    fix_description = (
        "Set <driver cache='none'/> (O_DIRECT, guest-controlled flushes); keep directsync only for a guest OS "
        "that never flushes."
    )
    fix_safe = True
    pve = CACHE_NONE  # the same fix as 'qm set' (proxmox/qmset.py)
    references = (
        "QEMU docs, -drive cache= table: directsync = cache.direct=on + write-cache off",
        "libvirt formatdomain: disk driver cache (directsync since 0.9.5)",
        "seed:003 (write-through modes: every write waits for the disk)",
    )
    verify = BlockExperiment(CACHE_JOB)

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        for disk in data_disks(guest, writable=True):
            if low(disk.cache) != "directsync" or is_passthrough_lun(disk) or low(disk.source_type) in NO_BLOCK_LAYER:
                continue
            yield self.finding(
                target=self.target(guest, disk.label),
                actual="directsync (O_DIRECT, and each write synced: no write cache for the guest)",
                expected="none (O_DIRECT, the guest's own flushes decide durability)",
                evidence=disk.where("cache"),
                source=guest.origin,
            )
