from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import NoExperiment
from kvmtune.kubevirt.form import no_field

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest

# seconds between the guest's memory statistics: OpenStack nova's default ([libvirt] mem_stats_period_seconds)
PERIOD = 10

# the balloon models whose driver reports statistics (libvirt formatdomain, "Memory balloon device")
VIRTIO_MODELS = frozenset({"virtio", "virtio-transitional", "virtio-non-transitional"})


class BalloonWithoutStatsPeriod(GuestRule):
    id = "KVM-MEM-013"
    slug = "balloon-without-stats-period"
    topic = "balloon"
    severity = Severity.LOW
    title = "virtio balloon without a statistics period: the host cannot see how much memory the guest uses"
    why = (
        "QEMU asks the guest's balloon driver for its memory statistics (free, available, page cache, major "
        "faults, swap in/out) only when a polling period is set; libvirt sets it from <stats period>, and QEMU's "
        "default is none. Without it virsh dommemstat and libvirt's balloon statistics show only the balloon's "
        "size and the QEMU process's RSS, so nobody can tell a guest that is short of memory from one that "
        "holds it idle before deflating or inflating its balloon."
    )
    fix_kind = "xml"
    fix_description = (
        f"<memballoon model='virtio'><stats period='{PERIOD}'/></memballoon> (libvirt 1.1.1). "
        "On a running libvirt domain `kvmtune fix --live` sets it live too (virDomainSetMemoryStatsPeriod)."
    )
    fix_safe = True
    references = (
        "libvirt formatdomain 'Memory balloon device': <stats period> (since 1.1.1)",
        "libvirt virDomainSetMemoryStatsPeriod (virsh dommemstat --period, --live/--config)",
        "OpenStack nova [libvirt] mem_stats_period_seconds = 10",
    )
    kubevirt = no_field("virt-launcher sets the balloon's statistics period itself (KubeVirt's memBalloonStatsPeriod)")
    verify = NoExperiment("a statistics period makes guest memory use visible; no speed effect to measure")

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        # a libvirt definition only: QEMU's command line cannot state it (libvirt sets it by QMP after start) and
        # Proxmox VE's qemu-server sets its own polling interval when it starts a VM with a balloon
        if guest.origin_kind not in ("xml", "libvirt") or guest.memballoon not in VIRTIO_MODELS:
            return
        if guest.balloon_stats_period:
            return
        yield self.finding(
            target=self.target(guest, "memballoon"),
            actual="no <stats period>" if guest.balloon_stats_period is None else "<stats period='0'> (off)",
            expected=f"<stats period='{PERIOD}'/>",
            evidence=guest.where("memballoon") or "/domain/devices/memballoon",
            source=guest.origin,
        )
