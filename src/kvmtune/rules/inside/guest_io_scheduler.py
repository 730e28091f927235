from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.host.settings import SCHED_GOOD, SCHED_GOOD_LEGACY

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest

# a virtual disk: the host's scheduler already orders the requests on the real device
GOOD = SCHED_GOOD["virtual"] | SCHED_GOOD_LEGACY["virtual"]


class GuestIoScheduler(GuestRule):
    id = "KVM-INS-001"
    slug = "guest-io-scheduler"
    topic = "io-scheduler"
    judges_only = "inside"
    severity = Severity.MEDIUM
    title = "The guest schedules I/O to a virtio disk with a scheduler made for rotating disks"
    why = (
        "A virtio disk is a queue into QEMU; the host's own scheduler orders the requests on the real device. "
        "bfq or cfq inside the guest idles per process and reorders for a seek cost the virtual disk does not "
        "have, adding latency twice; none or mq-deadline (noop or deadline before blk-mq) pass requests on."
    )
    fix_kind = "manual"
    fix_description = (
        "Inside the guest: echo none > /sys/block/DISK/queue/scheduler, made lasting with a udev rule "
        "(ACTION==\"add|change\", KERNEL==\"vd[a-z]*\", ATTR{queue/scheduler}=\"none\") or tuned's virtual-guest "
        "profile. kvmtune never writes inside a guest."
    )
    references = (
        "seed:000 'Best practice: Optimize block I/O performance by using the Deadline I/O scheduler'",
        "RHEL 9 'Monitoring and managing system status and performance': 'Disk schedulers' (none for virtual guests)",
        "Linux Documentation/block/switching-sched.rst",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        inside = guest.inside
        if inside is None or not inside.schedulers:
            return
        for disk in inside.schedulers:
            virtio = disk.bus == "virtio" or (disk.bus is None and disk.name.startswith("vd"))
            if not virtio or disk.current is None or disk.current in GOOD:
                continue
            better = "none" if "none" in disk.available else ("noop" if "noop" in disk.available else "mq-deadline")
            yield self.finding(
                target=self.target(guest, f"guest-disk:{disk.name}"),
                actual=disk.current,
                expected=f"{better} (or mq-deadline)",
                evidence=f"guest agent ({inside.via}): /sys/block/{disk.name}/queue/scheduler",
                source=guest.origin,
            )
