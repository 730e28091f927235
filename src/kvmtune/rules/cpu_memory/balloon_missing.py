from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import NoExperiment
from kvmtune.proxmox.qmset import PveForm
from kvmtune.rules.common import low

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class BalloonMissing(GuestRule):
    id = "KVM-MEM-002"
    slug = "balloon-missing"
    topic = "balloon"
    severity = Severity.LOW
    title = "No memory balloon device: no guest memory statistics, no way to reclaim memory"
    why = (
        "The virtio balloon is how the host learns how much memory a guest really uses (virsh dommemstat) "
        "and how it can take memory back or get freed pages reported (free page reporting) instead of "
        "swapping the guest. Without it, memory is reserved at its maximum. It is right to leave it out for "
        "guests with passed-through devices (VFIO pins all memory), locked memory or hugepages."
    )
    fix_kind = "xml"
    fix_description = (
        "Use <memballoon model='virtio'> (add <stats period='10'/>, and freePageReporting='on' for guests "
        "with Linux >= 5.7); keep model='none' on VFIO, locked or hugepage guests."
    )
    fix_safe = True
    # the same fix as 'qm set' (proxmox/qmset.py)
    pve = PveForm("set", "Hardware > Memory > Ballooning Device", (("balloon", ""),))
    references = (
        "seed:000 (virtio_balloon: the hypervisor's path to over-commit memory)",
        "libvirt formatdomain: memory balloon device (autodeflate, freePageReporting)",
        "Proxmox qm.adoc: leave ballooning enabled; nova mem_stats_period_seconds=10",
    )
    verify = NoExperiment("a balloon device reports and reclaims guest memory; no speed effect to measure")

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        if low(guest.memballoon) != "none":
            return
        if guest.hostdevs or guest.memory_locked or guest.hugepages:
            return  # none is the right choice there
        yield self.finding(
            target=self.target(guest, "memballoon"),
            actual="memballoon model='none'" if guest.origin_kind != "cmdline" else "no virtio-balloon device",
            expected="memballoon model='virtio' with stats",
            evidence=guest.where("memballoon") or "/domain/devices/memballoon",
            source=guest.origin,
        )
