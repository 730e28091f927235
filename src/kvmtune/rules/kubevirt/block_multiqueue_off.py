from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.kubevirt.form import KubevirtForm
from kvmtune.kubevirt.guest import spec_of
from kvmtune.rules.common import data_disks, low

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class BlockMultiQueueOff(GuestRule):
    id = "KVM-KUB-001"
    slug = "kubevirt-block-multiqueue-off"
    topic = "iothreads"
    severity = Severity.LOW
    title = "KubeVirt VM with several vCPUs and virtio disks but blockMultiQueue off: one queue per disk"
    why = (
        "KubeVirt gives each virtio-blk disk a single request queue unless spec.domain.devices.blockMultiQueue is "
        "true; then it gives each disk one queue per requested vCPU. With one queue every vCPU's I/O goes through "
        "the same ring and its one completion interrupt, so a guest with several vCPUs issuing I/O in parallel "
        "serialises on it, and IOThread virtqueue mapping has only one queue to spread."
    )
    fix_kind = "manual"
    fix_description = "KubeVirt: set spec.template.spec.domain.devices.blockMultiQueue: true (restart)."
    fix_safe = True
    kubevirt = KubevirtForm("domain.devices.blockMultiQueue", "true", "queues = the VM's vCPUs", setting=True)
    references = (
        "KubeVirt user guide, storage/disks_and_volumes.md: High Performance Features, blockMultiQueue",
        "Red Hat Developer 2025-06-23: multiple IOThreads in OpenShift Virtualization (virtqueue mapping)",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        spec = spec_of(guest)
        if spec is None or (guest.vcpus or 1) < 2:
            return
        disks = [d for d in data_disks(guest) if low(d.bus) == "virtio" and not d.readonly]
        if not disks or any(d.queues for d in disks):
            return
        yield self.finding(
            target=self.target(guest),
            actual=f"blockMultiQueue not set: 1 queue on {len(disks)} virtio disk(s), {guest.vcpus} vCPUs",
            expected="blockMultiQueue: true",
            evidence=disks[0].where("queues"),
            source=guest.origin,
        )
