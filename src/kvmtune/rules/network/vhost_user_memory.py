from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.domain.cputune import kids

if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


def shared_memory(guest: Guest) -> bool:
    """<memoryBacking><access mode='shared'/> or every guest NUMA cell with memAccess='shared'."""
    tree: Any = guest.tree
    root = tree.getroot() if hasattr(tree, "getroot") else tree
    top = kids(root, "memoryBacking", "cpu")
    backing = top.get("memoryBacking")
    access = kids(backing, "access").get("access") if backing is not None else None
    if access is not None and access.get("mode") == "shared":
        return True
    numa = kids(top["cpu"], "numa").get("numa") if "cpu" in top else None
    cells = list(numa.iterchildren("cell")) if numa is not None else []
    return bool(cells) and all(c.get("memAccess") == "shared" for c in cells)


class VhostUserMemory(GuestRule):
    id = "KVM-NET-020"
    slug = "vhost-user-without-shared-memory"
    topic = "net-backend"
    judges_only = "nics"
    severity = Severity.HIGH
    also_severities = (Severity.LOW,)
    title = "vhost-user NIC without shared (hugepage-backed) guest memory"
    why = (
        "A vhost-user backend (OVS-DPDK, passt, a VPP switch) reads and writes the guest's virtqueues in its own "
        "process, so guest RAM must be a shared mapping: without <access mode='shared'/> the backend sees no "
        "packets (libvirt refuses to start such a guest in recent versions). OVS-DPDK also expects that memory "
        "to come from huge pages, as its poll-mode threads pin and translate it."
    )
    fix_kind = "manual"
    fix_description = (
        "<memoryBacking><hugepages/><access mode='shared'/></memoryBacking> for OVS-DPDK (or <source type='memfd'/> "
        "with shared access for passt). Not automatic: huge pages must be reserved on the host first, and the "
        "backing decides where the guest's RAM comes from."
    )
    fix_safe = False
    references = (
        "libvirt formatdomain 'Network interfaces: vhost-user': requires shared memory (memAccess / access mode)",
        "libvirt formatdomain 'Memory Backing': hugepages, source type='memfd', access mode='shared'",
        "Open vSwitch Documentation/topics/dpdk/vhost-user.rst: guest memory backed by shared huge pages",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        nics = [n for n in guest.nics if (n.type or "") == "vhostuser"]
        if not nics or guest.tree is None:
            return
        shared = shared_memory(guest)
        if shared and guest.hugepages:
            return
        for nic in nics:
            yield self.finding(
                target=self.target(guest, nic.label),
                actual=("shared memory, but not backed by huge pages" if shared
                        else "guest memory not shared") + " with a vhost-user NIC",
                expected="<memoryBacking><hugepages/><access mode='shared'/>",
                evidence="/domain/memoryBacking, /domain/cpu/numa/cell/@memAccess",
                source=guest.origin,
                severity=Severity.LOW if shared else Severity.HIGH,
            )
