from __future__ import annotations

from collections.abc import Iterator

from kvmtune.audit.context import AuditContext
from kvmtune.audit.finding import Finding, Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import GUEST_TIER, NoExperiment
from kvmtune.model.guest import Guest
from kvmtune.rules.common import data_disks, low, machine_version, many_vcpus

FIRST_MULTIQUEUE = (5, 2)


class MachineTypeSingleQueue(GuestRule):
    id = "KVM-STO-011"
    slug = "machine-type-single-queue"
    topic = "iothreads"
    judges_only = "disks"
    severity = Severity.LOW
    also_severities = (Severity.MEDIUM,)  # what some findings are raised or lowered to
    title = "Machine type older than 5.2 keeps virtio disks on one queue"
    why = (
        "Since QEMU 5.2 virtio-blk and virtio-scsi get one request queue per vCPU automatically; every machine "
        "type up to 5.1 keeps the old default of a single queue for compatibility (hw_compat_5_1). A multi-vCPU "
        "guest then funnels all its I/O submissions and completions through one queue and one interrupt."
    )
    fix_kind = "xml"
    fix_description = (
        "Set <driver queues='N'/> (N = vCPUs) on each virtio disk, or queues on the virtio-scsi controller; "
        "moving to a newer machine type also works but changes the guest's hardware."
    )
    fix_safe = True
    references = (
        "QEMU hw/core/machine.c hw_compat_5_1: virtio-blk/virtio-scsi num-queues=1",
        "libvirt formatdomain: disk driver queues (since 3.9.0)",
    )
    verify = NoExperiment("virtio-blk queues are per vCPU inside the guest; " + GUEST_TIER)

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        version = machine_version(guest.machine)
        if version is None or (version[1], version[2]) >= FIRST_MULTIQUEUE or (guest.vcpus or 1) < 2:
            return
        single = []
        for disk in data_disks(guest):
            bus = low(disk.bus)
            blk_single = bus == "virtio" and (disk.queues or 0) <= 1
            # the queues of a virtio-scsi controller are not in the model: assume the machine default
            scsi = bus == "scsi" and (low(disk.scsi_controller_model) or "").startswith("virtio-scsi")
            if blk_single or scsi:
                single.append(disk.target)
        if not single:
            return
        yield self.finding(
            target=self.target(guest, "machine"),
            actual=f"{guest.machine}: 1 queue for {', '.join(single)} ({guest.vcpus} vCPUs)",
            expected="one queue per vCPU (machine type >= 5.2 or explicit queues)",
            evidence=guest.where("machine"),
            source=guest.origin,
            severity=Severity.MEDIUM if many_vcpus(guest) else Severity.LOW,
        )
