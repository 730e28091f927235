from __future__ import annotations

import re
from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import QUEUE_JOB, GuestExperiment
from kvmtune.rules.common import data_disks, low, machine_version, many_vcpus

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest

FIRST_MULTIQUEUE = (5, 2)
# Vendor machine types number their own versions. Each row: the machine-type pattern (family, version) and the
# first version whose virtio-blk/virtio-scsi get one queue per vCPU, with where that is set.
# RHEL (and CentOS Stream, Alma, Rocky, oVirt, CloudStack on them): every *-rhelX.Y.Z type up to rhel8.3.0
# applies hw_compat_rhel_8_3, which carries upstream's hw_compat_5_1 (virtio-blk-device num-queues=1,
# virtio-scsi-device num_queues=1); rhel8.4.0 (QEMU 5.2) is the first with per-vCPU queues. The
# pc-i440fx-rhel7.* types (the newest is pc-i440fx-rhel7.6.0, RHEL 8 added none) all predate it.
_VENDOR_MACHINE = re.compile(r"^([a-z0-9-]+?)-(rhel)(\d+)\.(\d+)\.(\d+)$")
VENDOR_FIRST_MULTIQUEUE: dict[str, tuple[tuple[int, int, int], str]] = {
    "rhel": ((8, 4, 0), "RHEL qemu-kvm hw/core/machine.c hw_compat_rhel_8_3 (= hw_compat_5_1: num-queues 1)"),
}


def single_queue_machine(machine: str | None) -> bool | None:
    """True when the machine type keeps virtio disks on one queue, False when it gives one per vCPU, None when
    the type is an alias or unknown (upstream's by number, the vendor table's by vendor version)."""
    version = machine_version(machine)
    if version is not None:
        return (version[1], version[2]) < FIRST_MULTIQUEUE
    m = _VENDOR_MACHINE.match(low(machine) or "")
    if m is None or m.group(2) not in VENDOR_FIRST_MULTIQUEUE:
        return None
    first, _where = VENDOR_FIRST_MULTIQUEUE[m.group(2)]
    return (int(m.group(3)), int(m.group(4)), int(m.group(5))) < first


class MachineTypeSingleQueue(GuestRule):
    id = "KVM-STO-011"
    slug = "machine-type-single-queue"
    topic = "iothreads"
    judges_only = "disks"
    severity = Severity.LOW
    also_severities = (Severity.MEDIUM,)  # what some findings are raised or lowered to
    title = "Machine type older than 5.2 (or RHEL's older than rhel8.4.0) keeps virtio disks on one queue"
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
        "RHEL machine types: qemu-kvm (CentOS Stream) hw/core/machine.c hw_compat_rhel_8_3 carries hw_compat_5_1 "
        "for pc-q35-rhel8.3.0 and older, pc-i440fx-rhel7.* and the other *-rhel8.3.0-and-older types",
    )
    verify = GuestExperiment("disk", QUEUE_JOB)

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        if not single_queue_machine(guest.machine) or (guest.vcpus or 1) < 2:
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
