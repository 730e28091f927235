"""``block_device_of``: the one way kvmtune finds the block device behind a path (``kvmtune why``'s backing device of a
guest disk, the storage bench's scratch directory)."""

from __future__ import annotations

import os
import stat

from kvmtune.host.parsers import parse_uevent
from kvmtune.host.root import HostReadError, HostRoot


def block_device_of(host: HostRoot, path: str, *, local: bool = False) -> str | None:
    """The block device (its /proc/diskstats name) holding ``path`` or being it, through ``/sys/dev/block/MAJ:MIN``
    (its uevent's DEVNAME, else its link's name); None for a file system without one (tmpfs, overlay, NFS).

    ``path`` is a host path, looked up under ``host``'s root (None when absent or leading out of it), unless
    ``local``: a file of kvmtune's own (a scratch directory), stat'ed where it is (OSError when absent)."""
    if local:
        st = os.stat(path)
    else:
        try:
            st = os.stat(host.beneath(path))
        except (OSError, HostReadError):
            return None
    dev = st.st_rdev if stat.S_ISBLK(st.st_mode) else st.st_dev
    node = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    name = parse_uevent(host.read_optional(f"{node}/uevent") or "").get("DEVNAME")
    if name:
        return name
    link = host.readlink(node)
    return link.rsplit("/", 1)[-1] or None if link else None
