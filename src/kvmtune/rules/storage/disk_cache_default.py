from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import CACHE_JOB, BlockExperiment
from kvmtune.proxmox.qmset import CACHE_NONE
from kvmtune.rules.common import cache_mode, data_disks, is_local, is_passthrough_lun, local_confidence, low

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class DiskCacheDefault(GuestRule):
    id = "KVM-STO-003"
    slug = "disk-cache-default"
    topic = "disk-cache"
    judges_only = "disks"
    severity = Severity.MEDIUM
    title = "Disk has no cache mode: QEMU's default (writeback) applies, not a choice anyone made"
    why = (
        "Without a cache attribute QEMU opens the image through the host page cache (writeback): every block "
        "the guest caches is cached a second time on the host, host memory pressure and writeback bursts hit "
        "all guests, and libvirt treats such disks as unsafe for live migration. Seed 003 traced its 5x "
        "slowdown to exactly this kind of silent default (then writethrough)."
    )
    fix_kind = "xml"
    fix_description = (
        "Choose the mode explicitly: <driver cache='none' io='native'/> (or io='io_uring') for local images "
        "and block devices; cache='writeback' only where O_DIRECT is unavailable (tmpfs) or deliberately wanted."
    )
    fix_safe = True
    pve = CACHE_NONE  # the same fix as 'qm set' (proxmox/qmset.py)
    references = (
        "seed:003 (the 'default' cache mode behind a 5x qcow2 slowdown; advice: never leave it at default)",
        "seed:000 (guest caching modes: bypass at least one of the two page caches)",
        "libvirt formatdomain: disk driver cache ('default' = hypervisor default)",
        "QEMU docs: -drive cache= (default writeback)",
    )
    verify = BlockExperiment(CACHE_JOB)

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        for disk in data_disks(guest, writable=True):
            if is_passthrough_lun(disk):
                continue  # SCSI commands pass through to the device, past the page cache
            cache = low(disk.cache)
            if cache_mode(disk) not in (None, "default") or not is_local(disk):
                continue
            yield self.finding(
                target=self.target(guest, disk.label),
                actual="default (QEMU: writeback through the host page cache)" if cache else "unset (QEMU: writeback)",
                expected="an explicit mode: none (O_DIRECT) for local storage",
                evidence=disk.where("cache"),
                source=guest.origin,
                confidence=local_confidence(disk),
            )
