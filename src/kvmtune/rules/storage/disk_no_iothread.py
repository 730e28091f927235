from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import IOTHREAD_JOB, GuestExperiment
from kvmtune.kubevirt.form import KubevirtForm
from kvmtune.proxmox.qmset import PveForm
from kvmtune.rules.common import NO_BLOCK_LAYER, data_disks, low, many_vcpus

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class DiskNoIothread(GuestRule):
    id = "KVM-STO-009"
    slug = "disk-no-iothread"
    topic = "iothreads"
    judges_only = "disks"
    severity = Severity.LOW
    also_severities = (Severity.MEDIUM,)  # what some findings are raised or lowered to
    title = "virtio disk without an IOThread on a multi-vCPU guest: its I/O runs in QEMU's main loop"
    why = (
        "Without an IOThread a virtio-blk disk is served by QEMU's main event loop, which it shares with "
        "every other device, the monitor and timers, under the big QEMU lock. On a guest with several vCPUs "
        "issuing I/O in parallel that single thread becomes the limit; a dedicated IOThread per busy disk "
        "removes it."
    )
    fix_kind = "xml"
    fix_description = "Add <iothreads>N</iothreads> to the domain and <driver iothread='k'/> to each busy virtio disk."
    fix_safe = True
    kubevirt = KubevirtForm("domain.ioThreadsPolicy", "auto", "or dedicatedIOThread: true on the busiest disk",
                            setting="auto", instancetype="ioThreadsPolicy")
    pve = PveForm("iothread", "Hardware > Hard Disk ({}) > IO thread")  # the same fix as 'qm set' (proxmox/qmset.py)
    references = (
        "libvirt formatdomain: IOThreads allocation, disk driver iothread (since 1.2.8)",
        "Red Hat Developer 2024-09-05: scaling virtio-blk with IOThread virtqueue mapping",
        "Proxmox qm.adoc: IO Thread recommended with VirtIO SCSI single / VirtIO Block",
    )
    verify = GuestExperiment("disk", IOTHREAD_JOB)

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        if (guest.vcpus or 1) < 2:
            return
        for disk in data_disks(guest):
            if low(disk.bus) != "virtio" or disk.iothread or low(disk.source_type) in NO_BLOCK_LAYER:
                continue
            yield self.finding(
                target=self.target(guest, disk.label),
                actual=f"no iothread ({guest.vcpus} vCPUs)",
                expected="driver iothread='N' (one IOThread per busy disk)",
                evidence=disk.where("iothread"),
                source=guest.origin,
                severity=Severity.MEDIUM if many_vcpus(guest) else Severity.LOW,
            )
