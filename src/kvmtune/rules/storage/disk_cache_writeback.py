from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import CACHE_JOB, BlockExperiment
from kvmtune.proxmox.qmset import CACHE_NONE
from kvmtune.rules.common import data_disks, is_local, is_passthrough_lun, low

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class DiskCacheWriteback(GuestRule):
    id = "KVM-STO-005"
    slug = "disk-cache-writeback"
    topic = "disk-cache"
    judges_only = "disks"
    severity = Severity.LOW
    title = "Disk uses cache='writeback': safe only for guests that flush, and cached twice"
    why = (
        "writeback shows the guest a disk with a volatile write cache and honours its flushes, so a guest "
        "that flushes (any current Linux or Windows filesystem with barriers on) loses nothing it was told "
        "is durable. A guest that does not flush (nobarrier mounts, some old kernels and applications) can "
        "lose recent writes on a host crash. Either way data is cached in guest and host RAM, and libvirt "
        "calls the disk unsafe for live migration unless the storage is coherent."
    )
    fix_kind = "xml"
    fix_description = "Prefer <driver cache='none' io='native'/>; keep writeback only where O_DIRECT is unavailable."
    fix_safe = True
    pve = CACHE_NONE  # the same fix as 'qm set' (proxmox/qmset.py)
    references = (
        "seed:000 (2012: writeback 'recommended only for temporary data' - written before guests flushed reliably)",
        "seed:003 (writeback fast, but 'more prone to data loss')",
        "libvirt formatdomain: disk driver cache; nova driver.disk_cachemode (none, else writeback)",
        "kubevirt/kubevirt#6968 (writeback preferable to writethrough for guests that flush)",
    )
    verify = BlockExperiment(CACHE_JOB)

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        for disk in data_disks(guest, writable=True):
            if is_passthrough_lun(disk):
                continue  # SCSI commands pass through to the device, past the page cache
            if low(disk.cache) != "writeback" or not is_local(disk):
                continue
            yield self.finding(
                target=self.target(guest, disk.label),
                actual="writeback (host page cache, guest sees a volatile write cache)",
                expected="none (O_DIRECT); writeback only where O_DIRECT is unavailable",
                evidence=disk.where("cache"),
                source=guest.origin,
                confidence="possible",
            )
