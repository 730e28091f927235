"""Small helpers the guest rules share (no rules in here).

They only interpret the :mod:`kvmtune.model.guest` model: which disks carry
data, which NICs sit on a tap-like backend, how libvirt fills a default.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import TYPE_CHECKING

from kvmtune.model.values import libvirt_default_nic_model

if TYPE_CHECKING:
    from kvmtune.model.guest import Disk, Guest, Nic

# disks whose I/O goes through QEMU's file-posix driver (host page cache, O_DIRECT, linux-aio/io_uring)
LOCAL_SOURCES = frozenset({"file", "block", "volume"})
# disks QEMU's block layer does not serve at all (an external process does)
NO_BLOCK_LAYER = frozenset({"vhostuser", "vhostvdpa"})
# NIC types whose backend is a tap or macvtap device (where vhost-net and multiqueue apply)
TAP_TYPES = frozenset({"network", "bridge", "direct", "ethernet"})


# cached: the rules ask ~25,000 times per corpus audit, for a few dozen distinct values (virtio, none,
# qcow2, ...); a cache hit costs less than the call to a Python function would
@lru_cache(maxsize=512)
def low(value: str | None) -> str | None:
    return value.strip().lower() if isinstance(value, str) else None


def data_disks(guest: Guest, *, writable: bool = False) -> list[Disk]:
    """Disks that hold data (not CD-ROMs or floppies); with ``writable``, not read-only ones either."""
    # a list, not a generator, worked out once per guest (Guest.derived): nineteen rules ask, ~6,000 times
    # per corpus audit; callers only read it
    key = "data_disks_writable" if writable else "data_disks"
    found: list[Disk] | None = guest.derived.get(key)
    if found is None:
        found = guest.derived[key] = [d for d in guest.disks if d.is_data_disk and not (writable and d.readonly)]
    return found


def others_shown(labels: list[str], place: int, count: int) -> list[str]:
    """The first ``count`` of ``labels`` but the one at ``place``: the others a run rule names beside one
    guest, without building the full list of others for each guest (that is quadratic in a fleet)."""
    return [label for i, label in enumerate(labels[: count + 1]) if i != place][:count]


def is_passthrough_lun(disk: Disk) -> bool:
    """device='lun' (QEMU's scsi-block): the guest's SCSI commands go to the host device with SG_IO,
    past the host page cache, so cache and aio modes do not shape its I/O."""
    return low(disk.device) == "lun"


def is_local(disk: Disk) -> bool:
    return low(disk.source_type) in LOCAL_SOURCES


def local_confidence(disk: Disk) -> str:
    """A pool volume may turn out to be an iSCSI or RBD disk once libvirt resolves it."""
    return "likely" if low(disk.source_type) == "volume" else "certain"


def cache_mode(disk: Disk) -> str | None:
    """The cache mode in effect; None = QEMU's default (writeback).

    libvirt opens a writable shared disk with cache=none when no mode is written.
    """
    cache = low(disk.cache)
    if cache in (None, "default") and disk.shareable and not disk.readonly:
        return "none"
    return cache


def is_virtio_model(model: str | None) -> bool:
    m = low(model)
    return m is not None and m.startswith("virtio")


def on_tap(nic: Nic) -> bool:
    return low(nic.type) in TAP_TYPES


def vhost_off(nic: Nic) -> bool:
    """True when the NIC's data path is known to run in QEMU's userspace (no vhost-net)."""
    return nic.vhost is False or low(nic.driver_name) == "qemu"


def default_nic_model(guest: Guest) -> str | None:
    """The model libvirt picks when ``<model>`` is absent (qemuDomainDefaultNetModel)."""
    return libvirt_default_nic_model(guest.arch, guest.machine)


# a vendor may append its own revision to QEMU's version: Proxmox VE's pc-q35-3.1+pve0
_VERSIONED_MACHINE = re.compile(
    r"^(pc-i440fx|pc-q35|pc|virt|pseries|s390-ccw-virtio)-(\d+)\.(\d+)(?:\.\d+)?(?:\+[a-z0-9._-]+)?$"
)


def machine_version(machine: str | None) -> tuple[str, int, int] | None:
    """``pc-q35-5.1`` and ``pc-q35-5.1+pve0`` -> ("pc-q35", 5, 1).

    None for aliases (pc, q35) and vendor types whose number is not QEMU's (pc-q35-rhel8.6.0).
    """
    m = _VERSIONED_MACHINE.match(low(machine) or "")
    if not m:
        return None
    return m.group(1), int(m.group(2)), int(m.group(3))


def many_vcpus(guest: Guest, threshold: int = 4) -> bool:
    return (guest.vcpus or 1) >= threshold
