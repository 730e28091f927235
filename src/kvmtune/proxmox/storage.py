"""``/etc/pve/storage.cfg``: storage IDs to a path or a backend (PVE admin guide, "Proxmox VE Storage").

Sections are ``TYPE: ID`` followed by indented ``key value`` lines. A volume ID ``STORAGE:VOLUME`` becomes
what PVE's storage plugin's ``path()`` gives QEMU: a file below a directory storage's ``images/<vmid>/``
(on btrfs a raw image is ``images/<vmid>/<name>/disk.raw``, its subvolume), ``/dev/<vg>/<lv>`` on LVM (qcow2
when the volume's name says so, PVE 9's volume chains), ``/dev/zvol/<pool>/<vol>`` on ZFS, ``pool/image``
through librbd (or a kernel RBD device with ``krbd 1``), ``/dev/disk/by-id/<scsi id>`` for an iSCSI LUN (the
kernel initiator). A storage ID that is not defined, of a type not read here, or a volume name with an empty,
``.`` or ``..`` component is named and left unresolved, never guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kvmtune.errors import InputError

STORAGE_TYPES = frozenset({"dir", "lvm", "lvmthin", "zfspool", "rbd", "nfs", "cifs", "iscsi", "iscsidirect", "zfs",
                           "cephfs", "glusterfs", "btrfs", "pbs", "esxi"})
READ_TYPES = frozenset({"dir", "lvm", "lvmthin", "zfspool", "rbd", "nfs", "cifs", "iscsi", "btrfs"})
_HEAD = re.compile(r"^([a-z]+):\s*([A-Za-z][A-Za-z0-9_.-]*)\s*$")
_PROP = re.compile(r"^\s+([a-z][a-z0-9_-]*)(?:\s+(.*?))?\s*$")
# PVE's storage plugin: a storage.cfg without 'local' still has it (dir /var/lib/vz)
DEFAULT_LOCAL = ("local", "dir", {"path": "/var/lib/vz", "content": "iso,vztmpl,backup"})


@dataclass(frozen=True)
class Storage:
    id: str
    type: str
    props: dict[str, str] = field(default_factory=dict)

    @property
    def krbd(self) -> bool:
        return self.type == "rbd" and self.props.get("krbd", "0") in ("1", "on", "yes")

    @property
    def cache_direct_default(self) -> bool:
        """Whether a disk that states no cache= is opened with O_DIRECT (qemu-server's ``drive_uses_cache_direct``):
        everywhere but on btrfs without ``nocow``, where O_DIRECT would break data checksums."""
        return not (self.type == "btrfs" and self.props.get("nocow", "0") not in ("1", "on", "yes"))


@dataclass(frozen=True)
class Volume:
    """Where a disk's data lives, as QEMU opens it (``protocol`` is QEMU's block driver)."""

    source: str | None
    source_type: str | None  # file | block | network, as the command-line reader says it
    protocol: str | None
    format: str | None
    storage: Storage | None = None
    problem: str | None = None  # why it could not be resolved (unknown storage, a type not read)


def parse_storage_cfg(text: str, path: str) -> dict[str, Storage]:
    storages: dict[str, Storage] = {}
    current: tuple[str, str, dict[str, str]] | None = None
    for number, raw in enumerate(text.split("\n"), 1):  # PVE's SectionConfig splits on \n only
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        if m := _HEAD.match(raw):
            if current:
                storages[current[0]] = Storage(current[0], current[1], current[2])
            kind, sid = m.group(1), m.group(2)
            if kind not in STORAGE_TYPES:
                raise InputError(path, f"unknown storage type {kind!r}", number)
            current = (sid, kind, {})
            continue
        m = _PROP.match(raw)
        if m is None or current is None:
            raise InputError(path, f"not a 'TYPE: ID' header or an indented 'key value' line: {raw.strip()[:60]!r}",
                             number)
        current[2][m.group(1)] = m.group(2) or "1"  # a bare key ('sparse', 'disable') is a flag
    if current:
        storages[current[0]] = Storage(current[0], current[1], current[2])
    if DEFAULT_LOCAL[0] not in storages:
        storages[DEFAULT_LOCAL[0]] = Storage(DEFAULT_LOCAL[0], DEFAULT_LOCAL[1], dict(DEFAULT_LOCAL[2]))
    return storages


def default_storages() -> dict[str, Storage]:
    """No storage.cfg at all: PVE still knows 'local'."""
    return parse_storage_cfg("", "(none)")


def _format_of(name: str) -> str:
    ext = name.rsplit(".", 1)[-1].lower() if "." in name else ""
    return ext if ext in ("raw", "qcow2", "vmdk", "qed", "cow", "qcow", "cloop") else "raw"


def resolve_volume(volume: str, storages: dict[str, Storage] | None, fmt: str | None) -> Volume:
    """A drive's volume (``STORAGE:VOLUME``, an absolute path, ``none`` or ``cdrom``) as QEMU will open it."""
    if volume in ("none", ""):
        return Volume(None, None, None, None)
    if volume == "cdrom":
        return Volume("/dev/cdrom", "block", "host_cdrom", "raw")
    if volume.startswith("/"):
        block = volume.startswith("/dev/")
        return Volume(volume, "block" if block else "file", "host_device" if block else "file",
                      fmt or ("raw" if block else _format_of(volume)))
    sid, sep, name = volume.partition(":")
    if not sep:
        return Volume(None, None, None, fmt, problem=f"volume {volume!r} names no storage (STORAGE:VOLUME)")
    if storages is None:
        return Volume(None, None, None, fmt, problem=f"storage {sid!r}: no storage.cfg was read")
    storage = storages.get(sid)
    if storage is None:
        return Volume(None, None, None, fmt, problem=f"storage {sid!r} is not defined in storage.cfg")
    if any(part in ("", ".", "..") for part in name.split("/")):  # PVE's parse_volname refuses these too
        return Volume(None, None, None, fmt, storage, f"volume {volume!r} has an empty, '.' or '..' path component")
    return _on_storage(storage, name, fmt)


def _on_storage(storage: Storage, name: str, fmt: str | None) -> Volume:
    """Volume ``name`` of ``storage`` as its plugin's ``path()`` gives it to QEMU."""
    sid, p, last = storage.id, storage.props, name.rsplit("/", 1)[-1]
    if storage.type in ("dir", "nfs", "cifs"):
        base = p.get("path") or (f"/mnt/pve/{sid}" if storage.type != "dir" else None)
        if base is None:
            return Volume(None, None, None, fmt, storage, f"storage {sid!r} (dir) has no path")
        sub = f"template/iso/{name[4:]}" if name.startswith("iso/") else f"images/{'/'.join(name.split('/')[-2:])}"
        return Volume(f"{base.rstrip('/')}/{sub}", "file", "file", fmt or _format_of(last), storage)
    if storage.type == "btrfs":  # PVE's BTRFS plugin: a raw image is disk.raw in a subvolume named after it
        base = p.get("path")
        if base is None:
            return Volume(None, None, None, fmt, storage, f"storage {sid!r} (btrfs) has no path")
        fmt = fmt or _format_of(last)
        leaf = f"{last.removesuffix('.raw')}/disk.raw" if fmt == "raw" and last.endswith(".raw") else last
        sub = "/".join([*name.split("/")[-2:-1], leaf])  # <vmid>/<leaf>, a linked clone's base part dropped
        return Volume(f"{base.rstrip('/')}/images/{sub}", "file", "file", fmt, storage)
    if storage.type in ("lvm", "lvmthin"):  # PVE 9: a qcow2 volume on LVM (snapshots as a volume chain)
        lv_format = "qcow2" if storage.type == "lvm" and last.endswith(".qcow2") else "raw"
        return Volume(f"/dev/{p.get('vgname', '?')}/{last}", "block", "host_device", lv_format, storage)
    if storage.type == "zfspool":
        return Volume(f"/dev/zvol/{p.get('pool', '?')}/{last}", "block", "host_device", "raw", storage)
    if storage.type == "rbd":
        pool = p.get("pool", "rbd")
        if storage.krbd:  # PVE maps it with the kernel client (/dev/rbd-pve/<fsid>/<pool>/<image>)
            return Volume(f"/dev/rbd/{pool}/{last}", "block", "host_device", "raw", storage)
        return Volume(f"{pool}/{last}", "network", "rbd", "raw", storage)
    if storage.type == "iscsi":  # the kernel initiator's LUN: volume 0.0.<lun>.<scsi id> is /dev/disk/by-id/<scsi id>
        parts = name.split(".", 3)
        return Volume(f"/dev/disk/by-id/{parts[-1]}", "block", "host_device", "raw", storage)
    return Volume(None, None, None, fmt, storage, f"storage {sid!r} is of type {storage.type}, which kvmtune does not "
                  "resolve")
