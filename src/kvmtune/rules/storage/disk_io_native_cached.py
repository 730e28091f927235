from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import CACHE_JOB, BlockExperiment
from kvmtune.proxmox.qmset import CACHE_NONE
from kvmtune.rules.common import cache_mode, is_local, is_passthrough_lun, local_confidence

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class DiskIoNativeCached(GuestRule):
    id = "KVM-STO-007"
    slug = "disk-io-native-cached"
    topic = "disk-io-mode"
    judges_only = "disks"
    severity = Severity.CRITICAL
    title = "io='native' on a disk without O_DIRECT: libvirt and QEMU refuse it"
    why = (
        "Linux native AIO only works on files opened with O_DIRECT, i.e. cache none or directsync. With any "
        "other cache mode, including none written (QEMU's writeback), libvirt refuses the definition and QEMU "
        "refuses to open the image ('aio=native was specified, but it requires cache.direct=on'): the guest "
        "cannot start."
    )
    fix_kind = "xml"
    fix_description = "Set cache='none' next to io='native' (or drop io='native' if host caching is really wanted)."
    fix_safe = True
    pve = CACHE_NONE  # the same fix as 'qm set' (proxmox/qmset.py)
    references = (
        "QEMU block/file-posix.c raw_open_common: aio=native requires cache.direct=on",
        "nova driver._set_cache_mode: io=native downgraded to threads for non-O_DIRECT modes (LP#1841363)",
        "libvirt qemu_validate.c: io='native' needs either no disk cache or directsync cache mode",
    )
    verify = BlockExperiment(CACHE_JOB)

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        for disk in guest.disks:
            if is_passthrough_lun(disk):
                continue  # SCSI commands pass through to the device, past the page cache
            cache = cache_mode(disk)
            # any local disk, CD-ROMs included: QEMU refuses to open the image whatever the guest uses it for
            if (disk.io or "").strip().lower() != "native" or cache in ("none", "directsync") or not is_local(disk):
                continue
            yield self.finding(
                target=self.target(guest, disk.label),
                actual=f"io=native with cache={cache or 'unset (writeback)'}",
                expected="io=native only with cache=none or directsync",
                evidence=disk.where("io"),
                source=guest.origin,
                confidence=local_confidence(disk),
            )
