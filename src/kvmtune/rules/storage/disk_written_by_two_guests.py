from __future__ import annotations

import posixpath
from collections import Counter, defaultdict
from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule, RunRule
from kvmtune.rules.common import data_disks, low, others_shown

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Disk, Guest


def host_of(guest: Guest) -> str | None:
    """Which host a guest is defined on, as far as the run knows: this host, or one libvirt URI; ``None`` for
    a file from anywhere (files audited together may come from many hosts)."""
    if guest.on_audited_host:
        return "this host"
    if guest.origin_kind == "libvirt":
        return guest.origin.split("#", 1)[0]
    return None


def disk_key(disk: Disk) -> str | None:
    """What names the storage a disk writes: a local path (normalised), or a network protocol and name."""
    if not disk.source:
        return None
    kind = low(disk.source_type)
    if kind in ("file", "block"):
        return posixpath.normpath(disk.source) if disk.source.startswith("/") else None
    if kind == "network" and disk.protocol:
        return f"{disk.protocol}:{disk.source}"
    return None  # pool volumes (the pool is not in the model), NVMe, vhost-user: not compared


class DiskWrittenByTwoGuests(RunRule):
    id = "KVM-STO-023"
    slug = "disk-written-by-two-guests"
    topic = "disk-cache"
    severity = Severity.HIGH
    also_severities = (Severity.CRITICAL,)
    title = "Two guests of one host write the same disk image or volume without <shareable/>"
    why = (
        "Each guest's file system assumes it owns the disk: it caches metadata, and writes without telling "
        "anyone. Two guests writing one image or LV overwrite each other's blocks and both file systems end up "
        "corrupt; a qcow2 image's own metadata breaks too. QEMU's image locking refuses to start the second "
        "guest while the first runs on the same host, so the copied definition shows up as a guest that will "
        "not start, or, with locking off or on storage the lock does not reach, as silent corruption. It comes "
        "from cloning a definition and keeping its <source>."
    )
    fix_kind = "manual"
    fix_description = (
        "Give each guest its own image or volume (clone it: virt-clone, qemu-img create -b, lvcreate -s). "
        "Only a cluster file system in the guests (GFS2, OCFS2) or a quorum disk may share one: then mark it "
        "<shareable/> in every guest (libvirt then opens it with cache=none) and use raw, not qcow2."
    )
    fix_safe = False
    references = (
        "libvirt formatdomain 'Hard drives, floppy disks, CDROMs': <shareable/> ('the device is expected to be "
        "shared between domains … caching should be deactivated for that device')",
        "QEMU docs/system/qemu-block-drivers.rst 'Disk image file locking' (since QEMU 2.10)",
        "libvirt docs/kbase/locking.rst: virtlockd/sanlock guard a disk against a second writer",
    )

    def check_run(self, guests: list[Guest], ctx: AuditContext) -> Iterator[Finding]:
        # (host, storage) -> the guests (by identity) writing it, with the disk; one guest read twice
        # (its XML and its process) is one writer
        writers: dict[tuple[str, str], dict[tuple[str, ...], tuple[Guest, Disk]]] = defaultdict(dict)
        for guest in guests:
            host = host_of(guest)
            if host is None:
                continue
            for disk in data_disks(guest, writable=True):
                key = disk_key(disk)
                if key is not None and not disk.shareable:
                    writers[(host, key)].setdefault(guest.identity, (guest, disk))
        for (_host, key), by_id in sorted(writers.items()):
            if len(by_id) < 2:
                continue
            users = sorted(by_id.values(), key=lambda gd: (gd[0].name, gd[0].origin))
            names = Counter(g.name for g, _ in users)
            # a name two of the writers share gets its source: "db01 (a.xml)", not "db01" twice
            labels = [g.name if names[g.name] == 1 else f"{g.name} ({g.origin})" for g, _ in users]
            running = sum(1 for g, _ in users if g.active)
            for place, (guest, disk) in enumerate(users):
                # the other writers, without listing them all for each writer (linear in the writers, issue 38)
                shown = ", ".join(others_shown(labels, place, 5)) + (
                    f" and {len(users) - 1 - 5} more" if len(users) - 1 > 5 else "")
                yield self.finding(
                    target=GuestRule.target(guest, disk.label),
                    actual=f"{key} writable, also written by {shown}",
                    expected="a disk of its own (or <shareable/> in every guest, for a cluster file system)",
                    evidence=disk.where("source"),
                    source=guest.origin,
                    # two running writers corrupt now; defined ones when the second starts (or fails to)
                    severity=Severity.CRITICAL if running >= 2 else Severity.HIGH,
                )
