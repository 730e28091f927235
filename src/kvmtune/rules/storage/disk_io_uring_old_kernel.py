from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import AIO_JOB, BlockExperiment
from kvmtune.rules.common import data_disks, low

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest

NO_IO_URING = (5, 1)  # io_uring(7) first appeared in Linux 5.1
MATURE_IO_URING = (5, 10)  # the first LTS kernel QEMU's io_uring backend is routinely run on


class DiskIoUringOldKernel(GuestRule):
    id = "KVM-STO-021"
    slug = "disk-io-uring-old-kernel"
    topic = "disk-io-mode"
    judges_only = "disks"
    severity = Severity.MEDIUM
    also_severities = (Severity.HIGH,)
    title = "io='io_uring' on a host kernel too old for it: io='native' is the better choice there"
    why = (
        "QEMU's io_uring backend needs io_uring from the host kernel (Linux 5.1). Before 5.10 the interface was "
        "young: missing operations, short reads QEMU had to resubmit, and fixes that were never backported. On "
        "such a kernel io='native' (Linux AIO, stable for a decade) is as fast for O_DIRECT disks and is what "
        "kvmtune recommends; below 5.1 a disk with io_uring does not even open."
    )
    fix_kind = "xml"
    fix_description = "io='native' (with cache none/directsync) or io='threads'; takes effect at the next guest start."
    fix_safe = True
    references = (
        "libvirt formatdomain 'Hard drives': driver io (threads, native, io_uring since 6.3.0)",
        "QEMU 5.0 changelog: aio=io_uring; QEMU block/io_uring.c (short-read resubmission)",
        "Proxmox VE 7.0 release notes: io_uring the default async I/O (kernel 5.11, QEMU 6.0)",
        "Linux io_uring(7): available since 5.1",
    )
    verify = BlockExperiment(AIO_JOB)

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        if not guest.on_audited_host:
            return
        disks = [d for d in data_disks(guest) if low(d.io) == "io_uring"]
        if not disks:
            return
        kernel = ctx.facts.kernel_version
        if kernel is None or kernel >= MATURE_IO_URING:
            return
        for disk in disks:
            yield self.finding(
                target=self.target(guest, disk.label),
                actual=f"io=io_uring on host kernel {ctx.facts.kernel_release}",
                expected="io=native (cache none/directsync) or a host kernel >= 5.10",
                evidence=f"{disk.where('io')}; host /proc/sys/kernel/osrelease",
                severity=Severity.HIGH if kernel < NO_IO_URING else None,
                source=guest.origin,
            )
