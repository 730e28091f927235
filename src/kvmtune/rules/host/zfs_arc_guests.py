from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.host.settings import ZFS_ARC_GUEST_SHARE
from kvmtune.rules.host import HostFactsRule, gib

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts

GIB = 1024**3


class ZfsArcGuests(HostFactsRule):
    id = "KVM-HST-063"
    slug = "zfs-arc-vs-guest-memory"
    topic = "memory-overcommit"
    severity = Severity.MEDIUM
    title = "The ZFS ARC may grow into the memory the guests were given"
    why = (
        "The ARC grows up to zfs_arc_max and gives memory back only under pressure, slowly; when the guests' "
        "memory and the ARC's maximum together reach the host's RAM, guests start while the ARC holds their "
        "memory, and the host swaps, balloons or kills a guest (OOM)."
    )
    fix_kind = "manual"
    fix_description = (
        "Cap the ARC: echo BYTES > /sys/module/zfs/parameters/zfs_arc_max now, and 'options zfs zfs_arc_max=BYTES' "
        "in /etc/modprobe.d/zfs.conf (then update-initramfs -u -k all if the root is on ZFS)."
    )
    fix_safe = True
    references = (
        "Proxmox VE Administration Guide, 'ZFS on Linux' > 'Limit ZFS Memory Usage' (2 GiB base + 1 GiB per TiB "
        "of storage; installer default since PVE 8.1: 10 % of RAM, at most 16 GiB)",
        "https://pve.proxmox.com/wiki/ZFS_on_Linux",
        "OpenZFS module parameters: zfs_arc_max",
    )

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        arc = facts.zfs_arc
        total_kib = facts.mem_total_kib
        if arc is None or not total_kib or not facts.guests:
            return
        guests = facts.guest_memory_kib * 1024
        total = total_kib * 1024
        if guests + arc.c_max <= ZFS_ARC_GUEST_SHARE * total:
            return
        room = int(ZFS_ARC_GUEST_SHARE * total) - guests
        advice = (f"zfs_arc_max at most {gib(room / 1024)} ({room} bytes)" if room >= 2 * GIB
                  else "less guest memory: not even PVE's 2 GiB ARC minimum fits beside the guests")
        yield self.finding(
            target=self.at(ctx, "zfs-arc"),
            actual=(f"ARC max {gib(arc.c_max / 1024)} (now {gib(arc.size / 1024)}) + {len(facts.guests)} guest(s) "
                    f"holding {gib(facts.guest_memory_kib)} = {(guests + arc.c_max) / total:.0%} of "
                    f"{gib(total_kib)} RAM"),
            expected=f"guests' memory + ARC max within {ZFS_ARC_GUEST_SHARE:.0%} of RAM: {advice}",
            evidence="/proc/spl/kstat/zfs/arcstats c_max and size, /proc/meminfo MemTotal, QEMU -m of running guests",
        )
