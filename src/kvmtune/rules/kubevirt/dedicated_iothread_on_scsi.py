from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.kubevirt.form import KubevirtForm
from kvmtune.kubevirt.guest import spec_of

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class DedicatedIothreadOnScsi(GuestRule):
    id = "KVM-KUB-003"
    slug = "kubevirt-dedicated-iothread-scsi"
    topic = "iothreads"
    severity = Severity.MEDIUM
    title = "KubeVirt disk asks for a dedicated IOThread on the scsi bus, where KubeVirt does not support it"
    why = (
        "KubeVirt documents dedicatedIOThread as not supported for disks on the scsi bus: the disk does not get "
        "the IOThread the manifest asks for, and its I/O stays where it was. The setting looks tuned and is not."
    )
    fix_kind = "manual"
    fix_description = "KubeVirt: put the disk on bus virtio (virtio-blk), where dedicatedIOThread applies (restart)."
    fix_safe = False
    kubevirt = KubevirtForm("domain.devices.disks[{disk}].disk.bus", "virtio",
                            "the guest needs virtio-blk drivers; the device name changes (sda -> vda)",
                            setting="virtio", guest_visible=True)
    references = (
        "KubeVirt user guide, storage/disks_and_volumes.md: IOThreads, 'dedicatedIOThread is not supported for "
        "disks on the scsi bus'",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        spec = spec_of(guest)
        if spec is None:
            return
        disks = spec.get("domain.devices.disks")
        for i, d in enumerate(disks if isinstance(disks, list) else []):
            if not isinstance(d, dict) or d.get("dedicatedIOThread") is not True or i >= len(guest.disks):
                continue
            disk = guest.disks[i]
            if disk.bus != "scsi":
                continue
            yield self.finding(
                target=self.target(guest, disk.label),
                actual="dedicatedIOThread: true on bus scsi",
                expected="bus virtio with dedicatedIOThread, or no dedicatedIOThread",
                evidence=f"{disk.locator}.dedicatedIOThread",
                source=guest.origin,
            )
