from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.verifyplan import HostFixExperiment
from kvmtune.host.settings import IOMMU_PT, grub_host, iommu_pt_want, passthrough_guests
from kvmtune.rules.host import HostFactsRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


class IommuMode(HostFactsRule):
    id = "KVM-HST-047"
    slug = "iommu-mode-for-passthrough"
    topic = "iommu"
    severity = Severity.LOW
    also_severities = (Severity.HIGH,)
    title = "IOMMU off, or translating the host's own DMA, on a host with PCI passthrough"
    why = (
        "Passing a device to a guest (<hostdev>, vfio-pci) needs the IOMMU on: virt-host-validate checks for "
        "IOMMU groups and asks for intel_iommu=on on Intel. With the IOMMU on, every DMA of the devices the host "
        "keeps is translated too; passthrough mode (iommu=pt, domain type 'identity') maps them 1:1 and keeps the "
        "remapping for the devices given to guests."
    )
    fix_kind = "cmdline"
    fix_description = (
        "Add iommu=pt to the kernel command line: on Debian/Ubuntu GRUB `kvmtune fix --host` writes it into its own "
        "drop-in (/etc/default/grub.d/90-kvmtune.cfg, which their grub-mkconfig reads); run update-grub and reboot. "
        "Elsewhere: grubby --update-kernel=ALL --args='iommu=pt' (Fedora/RHEL), /etc/kernel/cmdline (systemd-boot, "
        "Proxmox VE's proxmox-boot-tool)."
    )
    fix_off = (
        "Add intel_iommu=on (Intel; AMD has it on by default) and iommu=pt to the kernel command line, e.g. "
        "grubby --update-kernel=ALL --args='intel_iommu=on iommu=pt', and reboot. Not automatic: turning the IOMMU "
        "on changes how every device does DMA; it is the operator's call."
    )
    fix_safe = False
    references = (
        "libvirt virt-host-validate: 'Checking if IOMMU is enabled by kernel' (/sys/kernel/iommu_groups)",
        "Documentation/admin-guide/kernel-parameters.txt: intel_iommu=on, iommu=pt, iommu.passthrough",
        "Documentation/ABI/testing/sysfs-kernel-iommu_groups: type (DMA, DMA-FQ, identity)",
        "RHEL 9 Configuring and managing virtualization: 'Attaching PCI devices' (intel_iommu=on iommu=pt)",
    )
    verify = HostFixExperiment()

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        passthrough = passthrough_guests(facts)
        if not passthrough:
            return
        names = ", ".join(passthrough[:5])
        groups = facts.iommu_groups
        if not groups:
            yield self.finding(
                target=self.at(ctx, "iommu"),
                actual=f"no IOMMU groups; guests with passed-through devices: {names}",
                expected="IOMMU on (intel_iommu=on on Intel)",
                evidence="/sys/kernel/iommu_groups; /proc/cmdline",
                severity=Severity.HIGH,
                fix_kind="manual",
                fix_description=self.fix_off,
            )
            return
        if iommu_pt_want(facts) is None:
            return
        yield self.finding(
            target=self.at(ctx, "iommu"),
            actual=f"IOMMU translating every device ({len(groups)} groups, none 'identity', no {IOMMU_PT}); "
                   f"passthrough guests: {names}",
            expected=f"{IOMMU_PT}: host devices mapped 1:1, remapping kept for the devices given to guests",
            evidence="/sys/kernel/iommu_groups/*/type; /proc/cmdline",
            # kvmtune writes it only into a GRUB drop-in: on another boot loader it is the operator's to add
            fix_kind=None if grub_host(facts) else "manual",
        )
