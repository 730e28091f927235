from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import BUS_JOB, GuestExperiment
from kvmtune.proxmox.qmset import PveForm
from kvmtune.rules.common import data_disks, low

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest

# libvirt model names and QEMU device names of HBAs QEMU emulates register by register
EMULATED_HBAS = {
    "lsilogic", "lsisas1068", "lsisas1078", "buslogic", "ncr53c90", "am53c974", "dc390",
    "lsi", "lsi53c895a", "lsi53c810", "mptsas1068", "megasas", "megasas-gen2", "esp",
    # VMware's paravirtual HBA is paravirtual for ESXi only: QEMU emulates its rings in the main loop
    "vmpvscsi", "pvscsi",
}


class ScsiControllerEmulated(GuestRule):
    id = "KVM-STO-012"
    slug = "scsi-controller-emulated"
    topic = "disk-bus"
    judges_only = "disks"
    severity = Severity.HIGH
    title = "SCSI disk on an emulated HBA (LSI, MegaRAID, ...) instead of virtio-scsi"
    why = (
        "An LSI or MegaRAID controller is emulated like the IDE controller of KVM-STO-001: each register access "
        "traps into QEMU, one request at a time. virtio-scsi keeps SCSI semantics (many disks, hot-plug, "
        "passthrough LUNs) on paravirtual queues. Seed 000 lists SCSI among the emulated block devices and "
        "measured emulation (IDE) at 19.0 MB/s against 85.8 MB/s for virtio (4.5x)."
    )
    fix_kind = "xml"
    fix_description = (
        "Set <controller type='scsi' model='virtio-scsi'/>; the guest needs the virtio_scsi driver (Windows: vioscsi)."
    )
    fix_safe = False
    # the same fix as 'qm set' (proxmox/qmset.py)
    pve = PveForm("scsihw", "Hardware > SCSI Controller > VirtIO SCSI single; Hard Disk > IO thread")
    references = (
        "seed:000 (emulated block devices; FFSB random writes 8 threads: virtio 85.8 MB/s vs emulated IDE 19.0 MB/s)",
        "libvirt formatdomain: controller type='scsi' models",
        "Proxmox qm.adoc: VirtIO SCSI single recommended (default for new Linux VMs since PVE 7.3)",
    )
    verify = GuestExperiment("controller", BUS_JOB)

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        for disk in data_disks(guest):
            if low(disk.bus) != "scsi":
                continue
            model = low(disk.scsi_controller_model) or "default"
            confidence, summary = "certain", None
            if model in ("default", "auto"):
                if not guest.is_x86:
                    continue  # pseries: ibmvscsi; virt/s390: virtio-scsi
                # actual names the effective model, as libvirt writes it back into the definition
                model, confidence = "lsilogic", "likely"
                summary = "SCSI controller without a model: libvirt gives x86 guests the emulated lsilogic"
            elif model not in EMULATED_HBAS:
                continue
            yield self.finding(
                target=self.target(guest, disk.label),
                actual=model,
                summary=summary,
                expected="virtio-scsi",
                evidence=disk.where("bus"),
                source=guest.origin,
                confidence=confidence,
            )
