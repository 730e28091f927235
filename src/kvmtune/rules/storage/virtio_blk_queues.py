from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import QUEUE_JOB, GuestExperiment
from kvmtune.rules.common import data_disks

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest

MIN_QUEUE_SIZE = 256  # QEMU's virtio-blk default since 5.0 (it was 128)


class VirtioBlkQueues(GuestRule):
    id = "KVM-STO-022"
    slug = "virtio-blk-queues"
    topic = "iothreads"
    judges_only = "disks"
    severity = Severity.LOW
    title = "virtio-blk disk with fewer queues than vCPUs, or a queue smaller than QEMU's default"
    why = (
        "Each virtio-blk queue is served by one guest blk-mq hardware context: with fewer queues than vCPUs, vCPUs "
        "share queues and their submissions serialise on its lock. QEMU (machine types from 5.2) gives one queue "
        "per vCPU unless queues= says otherwise. A queue_size below 256 (QEMU's default since 5.0) caps the "
        "requests in flight and the segments per request."
    )
    fix_kind = "xml"
    fix_description = "<driver queues='<vCPUs>' queue_size='256'> on the disk; takes effect at the next guest start."
    fix_safe = True
    references = (
        "libvirt formatdomain 'Hard drives': driver queues (since 3.9.0), queue_size (since 7.8.0)",
        "QEMU 5.2 hw/block/virtio-blk: num-queues defaults to the vCPU count (machine types >= 5.2)",
        "QEMU 5.0: virtio-blk queue-size default raised from 128 to 256",
        "RHEL 9 'Configuring and managing virtualization': 'Optimizing virtual machine I/O performance' (multi-queue virtio-blk)",
    )
    verify = GuestExperiment("disk", QUEUE_JOB)

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        vcpus = guest.vcpus or 1
        for disk in data_disks(guest):
            if disk.bus != "virtio" or (disk.queues is None and disk.queue_size is None):
                continue
            few = disk.queues is not None and disk.queues < vcpus
            small = disk.queue_size is not None and disk.queue_size < MIN_QUEUE_SIZE
            if not few and not small:
                continue
            actual = []
            if few:
                actual.append(f"queues={disk.queues} on {vcpus} vCPUs")
            if small:
                actual.append(f"queue_size={disk.queue_size}")
            yield self.finding(
                target=self.target(guest, disk.label),
                actual=", ".join(actual),
                expected=f"queues={vcpus} (or unset on machine types >= 5.2), queue_size >= {MIN_QUEUE_SIZE}",
                evidence=disk.where("queues" if few else "queue_size"),
                source=guest.origin,
            )
