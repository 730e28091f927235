from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import AIO_JOB, BlockExperiment
from kvmtune.proxmox.qmset import PveForm
from kvmtune.rules.common import cache_mode, data_disks, is_local, is_passthrough_lun, local_confidence, low

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class DiskIoThreads(GuestRule):
    id = "KVM-STO-006"
    slug = "disk-io-threads"
    topic = "disk-io-mode"
    judges_only = "disks"
    severity = Severity.LOW
    title = "O_DIRECT disk still uses the thread-pool AIO (io='threads' or unset)"
    why = (
        "With cache none/directsync the image is opened with O_DIRECT, so the kernel can take requests "
        "asynchronously (io='native', Linux AIO) or through io_uring. The default io='threads' instead hands "
        "each request to a pool of worker threads: more context switches and latency per I/O, which shows "
        "with many parallel requests (seed 000)."
    )
    fix_kind = "xml"
    fix_description = "Add io='native' (raw images, LVM, preallocated files) or io='io_uring' (QEMU >= 5.0, libvirt >= 6.3)."
    fix_safe = True
    pve = PveForm("aio", "Hardware > Hard Disk ({}) > Advanced > Async IO")  # the same fix as 'qm set' (proxmox/qmset.py)
    references = (
        "seed:000 (aio=native improves guest I/O, most with multiple threads)",
        "libvirt formatdomain: disk driver io (threads, native; io_uring since 6.3.0)",
        "Proxmox qemu-server Drive.pm aio_cmdline_option (io_uring default, native on LVM)",
    )
    verify = BlockExperiment(AIO_JOB)

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        for disk in data_disks(guest):
            if is_passthrough_lun(disk):
                continue  # SCSI commands pass through to the device, past the page cache
            if cache_mode(disk) not in ("none", "directsync") or not is_local(disk):
                continue
            io = low(disk.io)
            if io not in (None, "threads", "default"):
                continue
            yield self.finding(
                target=self.target(guest, disk.label),
                actual=f"io={io}" if io else "io unset (QEMU: threads)",
                expected="io=native or io=io_uring",
                evidence=disk.where("io"),
                source=guest.origin,
                confidence=local_confidence(disk),
            )
