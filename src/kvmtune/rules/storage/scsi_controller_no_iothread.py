from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import IOTHREAD_JOB, GuestExperiment
from kvmtune.proxmox.qmset import PveForm
from kvmtune.rules.common import data_disks, low, many_vcpus

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class ScsiControllerNoIothread(GuestRule):
    id = "KVM-STO-015"
    slug = "scsi-controller-no-iothread"
    topic = "iothreads"
    judges_only = "disks"
    severity = Severity.LOW
    also_severities = (Severity.MEDIUM,)  # from four vCPUs up
    title = "virtio-scsi controller without an IOThread on a multi-vCPU guest"
    why = (
        "A virtio-scsi controller without an IOThread is served by QEMU's main loop, like a virtio-blk disk "
        "without one (KVM-STO-009), and all disks on that controller share it. The IOThread of virtio-scsi is "
        "set on the controller; Proxmox VE's 'VirtIO SCSI single' gives each disk its own controller so that "
        "each disk can get its own IOThread."
    )
    fix_kind = "xml"
    fix_description = (
        "Add <iothreads>N</iothreads> and <controller type='scsi' model='virtio-scsi'><driver iothread='k'/>"
        "</controller>; on Proxmox VE use SCSI controller 'VirtIO SCSI single' with iothread=1 on each disk."
    )
    fix_safe = True
    # the same fix as 'qm set' (proxmox/qmset.py)
    pve = PveForm("scsihw", "Hardware > SCSI Controller > VirtIO SCSI single; Hard Disk > IO thread")
    references = (
        "libvirt formatdomain: controller driver iothread (virtio-scsi, since 1.3.5)",
        "Proxmox VE qm.adoc: IO Thread needs VirtIO SCSI single for SCSI disks",
        "QEMU hw/scsi/virtio-scsi.c: iothread property of virtio-scsi-pci",
    )
    verify = GuestExperiment("controller", IOTHREAD_JOB)

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        if (guest.vcpus or 1) < 2:
            return
        seen: set[str] = set()
        for disk in data_disks(guest):
            model = low(disk.scsi_controller_model) or ""
            if low(disk.bus) != "scsi" or not model.startswith("virtio-scsi") or disk.scsi_controller_iothread:
                continue
            controller = disk.scsi_controller or "0"
            if controller in seen:
                continue
            seen.add(controller)
            disks = [d.target for d in data_disks(guest)
                     if low(d.bus) == "scsi" and (d.scsi_controller or "0") == controller]
            yield self.finding(
                target=self.target(guest, f"scsi-controller:{controller}"),
                actual=f"no iothread for {', '.join(disks)} ({guest.vcpus} vCPUs)",
                expected="controller driver iothread='N'",
                evidence=disk.where("controller"),
                source=guest.origin,
                severity=Severity.MEDIUM if many_vcpus(guest) else Severity.LOW,
            )
