from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.rules.common import data_disks, low

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest

VIRTIO_VENDOR = 0x1AF4
# virtio PCI device ids: transitional (0x1000 + n) and modern (0x1040 + virtio device id), and the
# virtio-win driver that binds each
DEVICES = {
    "network": ((0x1000, 0x1041), "netkvm"),
    "block": ((0x1001, 0x1042), "viostor"),
    "scsi": ((0x1004, 0x1048), "vioscsi"),
    "balloon": ((0x1002, 0x1045), "balloon"),
    "rng": ((0x1005, 0x1044), "viorng"),
}


def _wanted(guest: Guest) -> list[str]:
    kinds = []
    if any(low(n.model) == "virtio" for n in guest.nics):
        kinds.append("network")
    if any(d.bus == "virtio" for d in data_disks(guest)):
        kinds.append("block")
    if any(d.bus == "scsi" and (d.scsi_controller_model or "").startswith("virtio") for d in data_disks(guest)):
        kinds.append("scsi")
    if low(guest.memballoon) == "virtio":
        kinds.append("balloon")
    if any((r.model or "virtio") == "virtio" for r in guest.rngs):
        kinds.append("rng")
    return kinds


class WindowsVirtioDriverMissing(GuestRule):
    id = "KVM-INS-006"
    slug = "windows-virtio-driver-missing"
    topic = "guest-drivers"
    judges_only = "inside"
    severity = Severity.HIGH
    title = "A Windows guest has a virtio device with no driver bound"
    why = (
        "Windows has no virtio drivers of its own: a virtio NIC, disk, SCSI controller, balloon or RNG without "
        "the virtio-win driver is an unknown device. The NIC does not work, the disk is not seen, the balloon "
        "cannot give memory back; guests then get moved to emulated e1000/IDE devices at a large cost."
    )
    fix_kind = "manual"
    fix_description = (
        "Inside the guest: install the virtio-win drivers (virtio-win ISO or its guest-tools installer) for the "
        "device named. kvmtune never writes inside a guest."
    )
    references = (
        "virtio-win (github.com/virtio-win/kvm-guest-drivers-windows): netkvm, viostor, vioscsi, balloon, viorng",
        "QEMU qga/qapi-schema.json: guest-get-devices (since 5.2)",
        "virtio 1.2 specification 4.1.2 'PCI Device Discovery' (vendor 0x1AF4, device 0x1040 + id)",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        inside = guest.inside
        if inside is None or not inside.is_windows or not inside.drivers:
            return  # no device list: the agent did not answer guest-get-devices
        bound = {d.device_id for d in inside.drivers if d.vendor_id == VIRTIO_VENDOR and d.driver}
        for kind in _wanted(guest):
            ids, driver = DEVICES[kind]
            if bound.intersection(ids):
                continue
            yield self.finding(
                target=self.target(guest, f"guest-device:virtio-{kind}"),
                actual=f"virtio {kind} device (PCI 1af4:{ids[0]:04x}/{ids[1]:04x}) with no driver in the guest",
                expected=f"the virtio-win {driver} driver",
                evidence=f"guest agent ({inside.via}): guest-get-devices",
                source=guest.origin,
            )
