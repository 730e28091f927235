from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.rules.host import HostFactsRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


class PveKernel(HostFactsRule):
    id = "KVM-HST-060"
    slug = "pve-kernel-not-proxmox"
    topic = "kvm-acceleration"
    severity = Severity.MEDIUM
    title = "A Proxmox VE node runs a kernel that is not Proxmox VE's"
    why = (
        "Proxmox VE ships and supports its own kernel (releases ending in -pve) with the ZFS module and the KVM, "
        "QEMU and storage fixes its qemu-server is tested with; a Debian or other kernel booted on a node lacks "
        "them, so ZFS pools, PVE's defaults and its bug reports no longer apply."
    )
    fix_kind = "manual"
    fix_description = (
        "Boot the Proxmox VE kernel: apt install proxmox-default-kernel, remove or unpin the other kernel "
        "(proxmox-boot-tool kernel list / kernel unpin), and reboot into a release ending in -pve."
    )
    fix_safe = False
    references = (
        "Proxmox VE Administration Guide, 'Host System Administration': the Proxmox VE kernel "
        "(proxmox-default-kernel, proxmox-boot-tool kernel pin)",
        "https://pve.proxmox.com/pve-docs/pve-admin-guide.html",
    )

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        release = facts.kernel_release
        if not facts.pve_node or release is None or "-pve" in release:
            return
        yield self.finding(
            target=self.at(ctx, "kernel"),
            actual=f"kernel {release} on a Proxmox VE node",
            expected="a Proxmox VE kernel (release ending in -pve, e.g. 6.8.12-4-pve)",
            evidence="/proc/sys/kernel/osrelease, /etc/pve",
        )
