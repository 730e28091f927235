from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


def is_i440fx(machine: str | None) -> bool:
    m = (machine or "").lower()
    return m == "pc" or m.startswith(("pc-i440fx", "pc-0.", "pc-1.")) or (m.startswith("pc-") and "q35" not in m
                                                                          and m.split("-")[1][:1].isdigit())


class I440fxPassthrough(GuestRule):
    id = "KVM-CPU-026"
    slug = "i440fx-with-pci-passthrough"
    topic = "host-devices"
    judges_only = "hostdevs"
    severity = Severity.MEDIUM
    title = "Guest with a passed-through device on the legacy i440fx machine instead of q35"
    why = (
        "i440fx emulates a PCI (not PCI Express) bus. A passed-through PCIe device lands on conventional PCI: "
        "its extended configuration space (AER, ATS, link speed, resizable BARs) is invisible to the guest "
        "driver, which for GPUs and many NICs disables features or refuses to load. q35 gives it a PCIe root "
        "port; Proxmox and Nova use q35 for PCIe passthrough."
    )
    fix_kind = "manual"
    fix_description = (
        "Redefine the guest on machine type q35 (virt-install --machine q35, or a new domain XML with "
        "pcie-root-port controllers). Not automatic: every device address and controller changes, and the "
        "guest OS sees new hardware (Windows may need its drivers re-detected)."
    )
    fix_safe = False
    references = (
        "libvirt formatdomain 'Host device assignment' and 'Controllers' (pcie-root-port on q35)",
        "QEMU docs/pcie.txt: PCI Express topology, devices on q35 root ports",
        "Proxmox VE qm.adoc 'PCI(e) Passthrough': the 'pcie' option needs machine type q35",
        "OpenStack Nova hw_machine_type (q35 for PCIe devices)",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        if not guest.hostdevs or not is_i440fx(guest.machine) or (guest.arch or "x86_64") not in ("x86_64", "i686"):
            return
        yield self.finding(
            target=self.target(guest, "machine"),
            actual=f"machine {guest.machine} with {guest.hostdevs} passed-through device(s)",
            expected="a q35 machine type (PCI Express root ports)",
            evidence=guest.where("machine") or "/domain/os/type/@machine",
            source=guest.origin,
        )
