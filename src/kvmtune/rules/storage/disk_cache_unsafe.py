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


class DiskCacheUnsafe(GuestRule):
    id = "KVM-STO-004"
    slug = "disk-cache-unsafe"
    topic = "disk-cache"
    judges_only = "disks"
    severity = Severity.CRITICAL
    title = "Disk uses cache='unsafe': guest flushes are ignored, a host crash loses acknowledged data"
    why = (
        "cache='unsafe' (cache.no-flush=on) throws away every flush the guest sends, so data a database or "
        "filesystem journal was told is durable may still sit only in host RAM. A host crash or power loss "
        "can lose it and leave the guest filesystem inconsistent. It exists for throw-away installs and CI."
    )
    fix_kind = "xml"
    fix_description = "Set <driver cache='none' io='native'/> (or cache='writeback' where O_DIRECT is unavailable)."
    fix_safe = True
    pve = CACHE_NONE  # the same fix as 'qm set' (proxmox/qmset.py)
    references = (
        "seed:000 (unsafe ignores flushes; for temporary data only, never in production)",
        "libvirt formatdomain: disk driver cache='unsafe'",
        "QEMU docs: cache.no-flush",
    )
    verify = BlockExperiment(
        CACHE_JOB,
        note="a safety fix: cache=unsafe drops the guest's flushes, so a host crash loses data the guest "
        "was told is on disk; expect it to measure slower, and apply it anyway",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        for disk in data_disks(guest, writable=True):
            if is_passthrough_lun(disk):
                continue  # SCSI commands pass through to the device, past the page cache
            if low(disk.cache) != "unsafe" or low(disk.source_type) in NO_BLOCK_LAYER:
                continue
            yield self.finding(
                target=self.target(guest, disk.label),
                actual="unsafe (guest flushes dropped)",
                expected="none, or writeback where O_DIRECT is unavailable",
                evidence=disk.where("cache"),
                source=guest.origin,
            )
