"""The values both readers normalise: one place for the domain XML reader (``domain/``) and the
command-line reader (``qemu/``).

A libvirt attribute and a QEMU option often say the same thing in two vocabularies; the
:class:`~kvmtune.model.guest.Guest` speaks libvirt's. Each mapping between the two lives here
once: cache modes, disk protocols and source types, device drivers to buses and NIC models,
switches, sizes and their units.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

# --- words and switches ---------------------------------------------------------------------------

@lru_cache(maxsize=512)  # ~20,000 attribute values per corpus audit, most of them the same few dozen words
def low(value: str | None) -> str | None:
    """An XML attribute as a keyword: stripped, lower case; ``None`` stays ``None``."""
    return value.strip().lower() if value is not None else None


def switch_on(value: str | None) -> bool:
    """libvirt's on/off switch (``autodeflate='on'``): only ``on`` turns it on."""
    return low(value) == "on"


def qemu_bool(value: Any) -> bool | None:
    """QEMU's boolean option (``on``/``off``, ``true``/``false``, ``yes``/``no``, JSON booleans); ``None``: not given."""
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("on", "true", "yes", "1")


def xml_int(text: str | None) -> int | None:
    """An XML number (decimal, or with a 0x/0o/0b prefix); ``None`` when absent or not a number."""
    if text is None:
        return None
    try:
        return int(text.strip(), 0)
    except ValueError:
        return None


# --- sizes ----------------------------------------------------------------------------------------

# KiB per unit: libvirt's unit= names; QEMU's size suffixes (k, M, G, T) are the binary ones among them
UNIT_KIB = {
    "b": 1 / 1024, "bytes": 1 / 1024, "k": 1, "kib": 1, "kb": 1000 / 1024,
    "m": 1024, "mib": 1024, "mb": 1e6 / 1024, "g": 1024**2, "gib": 1024**2,
    "gb": 1e9 / 1024, "t": 1024**3, "tib": 1024**3, "tb": 1e12 / 1024,
}
_QEMU_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)[iI]?[bB]?\s*")


def unit_kib(value: int, unit: str | None) -> int:
    """A libvirt size (``<memory unit='GiB'>4</memory>``) in KiB; no unit (or an unknown one) is KiB."""
    return int(value * UNIT_KIB.get((unit or "KiB").lower(), 1))


def qemu_size_kib(text: str) -> int | None:
    """A QEMU ``-m`` size (``4G``, ``2048``, ``512M``) in KiB: a bare number is MiB."""
    m = _QEMU_SIZE.fullmatch(str(text))
    if not m:
        return None
    return int(float(m.group(1)) * UNIT_KIB[m.group(2).lower() or "m"])


def qemu_object_kib(value: Any) -> int | None:
    """A QEMU object's size (``memory-backend-ram,size=...``): a bare number is bytes, unlike ``-m``."""
    if value is None:
        return None
    text = str(value).strip()
    if text.isdigit():
        return int(text) // 1024
    return qemu_size_kib(text)


# --- disks ----------------------------------------------------------------------------------------

# libvirt cache mode (and -drive cache=) -> (cache.direct, cache.no-flush, guest-visible write cache)
CACHE_MODES = {
    "none": (True, False, True), "off": (True, False, True), "directsync": (True, False, False),
    "writeback": (False, False, True), "writethrough": (False, False, False), "unsafe": (False, True, True),
}


def cache_mode(direct: bool | None, no_flush: bool | None, write_cache: bool | None) -> str | None:
    """QEMU's cache.direct / cache.no-flush / write-cache as libvirt's cache mode; ``None``: none of them set."""
    if direct is None and no_flush is None and write_cache is None:
        return None
    if no_flush:
        return "unsafe"
    wce = True if write_cache is None else write_cache
    if direct:
        return "none" if wce else "directsync"
    return "writeback" if wce else "writethrough"


# discard= values that pass a guest's discards on (libvirt's unmap, QEMU's unmap/on)
DISCARD_PASSES = ("unmap", "on")

# libvirt disk type -> the QEMU protocol driver it opens (network disks name theirs in source/@protocol)
PROTOCOL_OF_DISK_TYPE = {"file": "file", "block": "host_device", "nvme": "nvme", "vhostuser": "virtio-blk-vhost-user",
                         "vhostvdpa": "virtio-blk-vhost-vdpa", "dir": "vvfat"}
# QEMU protocol driver -> libvirt's disk (source) type; anything else is "network"
SOURCE_TYPE_OF_PROTOCOL = {
    "file": "file", "host_device": "block", "host_cdrom": "block", "nvme": "nvme", "null-co": "null",
    "null-aio": "null", "virtio-blk-vhost-user": "vhostuser", "virtio-blk-vhost-vdpa": "vhostvdpa",
    "virtio-blk-vfio-pci": "nvme", "nvme-io_uring": "block", "io_uring": "block",
}


def disk_protocol(disk_type: str, device: str | None, source_protocol: str | None) -> str | None:
    """The QEMU protocol driver behind a libvirt ``<disk type=... device=...>``: a network disk names its
    own (``<source protocol='rbd'>``), a block CD-ROM opens host_cdrom."""
    if disk_type == "network":
        return source_protocol
    protocol = PROTOCOL_OF_DISK_TYPE.get(disk_type)
    if protocol == "host_device" and device == "cdrom":
        return "host_cdrom"
    return protocol


# QEMU block device driver -> libvirt's disk bus
BUS_OF_DEVICE = {
    "virtio-blk-pci": "virtio", "virtio-blk-ccw": "virtio", "virtio-blk-device": "virtio",
    "virtio-blk": "virtio", "virtio-blk-pci-non-transitional": "virtio",
    "virtio-blk-pci-transitional": "virtio", "vhost-user-blk-pci": "virtio",
    "ide-hd": "ide", "ide-cd": "ide", "ide-drive": "ide",
    "scsi-hd": "scsi", "scsi-cd": "scsi", "scsi-block": "scsi", "scsi-generic": "scsi", "scsi-disk": "scsi",
    "usb-storage": "usb", "usb-bot": "usb", "floppy": "fdc", "isa-fdc": "fdc", "sd-card": "sd",
    "nvme": "nvme", "nvme-ns": "nvme",
}
# a <disk> whose <target> names no bus: the bus libvirt infers from the target's name prefix
# (virDomainDiskDefParseXML: hd -> ide, sd -> scsi, vd -> virtio, xvd -> xen, ub -> usb; a floppy is on fdc).
BUS_OF_TARGET_PREFIX = (("xvd", "xen"), ("hd", "ide"), ("sd", "scsi"), ("vd", "virtio"), ("ub", "usb"))


def bus_of_target(target: str | None, device: str | None) -> str | None:
    """The bus libvirt gives a disk whose ``<target>`` has no ``bus``; ``None``: a name it does not
    map (kvmtune then leaves the bus unknown rather than guess)."""
    if device == "floppy":
        return "fdc"
    name = (target or "").strip().lower()
    for prefix, bus in BUS_OF_TARGET_PREFIX:
        if name.startswith(prefix):
            return bus
    return None


# QEMU -drive if= -> libvirt's disk bus (others keep their name: ide, scsi, virtio, sd, ...)
BUS_OF_DRIVE_IF = {"none": None, "mtd": "mtd", "pflash": "pflash", "floppy": "fdc"}
# devices that hand SCSI commands to the host device (device='lun'): no host page cache in the data path
LUN_DEVICES = frozenset({"scsi-block"})


def machine_bus(bus: str | None, machine: str | None) -> str | None:
    """QEMU's IDE bus on a Q35 machine is its AHCI controller: libvirt's ``sata``."""
    if bus == "ide" and machine and "q35" in machine:
        return "sata"
    return bus


# --- NICs and other devices -----------------------------------------------------------------------

# QEMU NIC device driver -> libvirt's <model type=...>
NIC_MODEL_OF_DEVICE = {
    "virtio-net-pci": "virtio", "virtio-net-ccw": "virtio", "virtio-net-device": "virtio",
    "virtio-net-pci-non-transitional": "virtio", "virtio-net-pci-transitional": "virtio", "virtio-net": "virtio",
    "e1000": "e1000", "e1000-82540em": "e1000", "e1000e": "e1000e", "rtl8139": "rtl8139",
    "ne2k_pci": "ne2k_pci", "ne2k_isa": "ne2k_isa", "pcnet": "pcnet", "vmxnet3": "vmxnet3",
    "i82551": "i82551", "i82557b": "i82557b", "i82559er": "i82559er", "usb-net": "usb-net",
    "spapr-vlan": "spapr-vlan",
}


def libvirt_default_nic_model(arch: str | None, machine: str | None) -> str | None:
    """The NIC model libvirt picks when ``<model>`` is absent (qemuDomainDefaultNetModel); ``None``: not known here."""
    if arch in (None, "x86_64", "i686"):
        return "rtl8139"
    if (arch or "").startswith("s390"):
        return "virtio"
    if arch in ("aarch64", "armv7l", "riscv64", "loongarch64") and (machine or "").startswith("virt"):
        return "virtio"
    return None


# QEMU -netdev type -> libvirt's <interface type=...>
NIC_TYPE_OF_NETDEV = {"tap": "ethernet", "user": "user", "vhost-user": "vhostuser", "bridge": "bridge",
                      "vhost-vdpa": "vdpa", "socket": "socket", "stream": "stream", "passt": "user"}
# QEMU rng object -> libvirt's <rng><backend model=...>
RNG_BACKEND_OF_OBJECT = {"rng-random": "random", "rng-builtin": "builtin", "rng-egd": "egd"}
# host device types that pin all guest memory (VFIO): <hostdev type=...> and QEMU device drivers
VFIO_HOSTDEV_TYPES = ("pci", "mdev")


# --- templates ------------------------------------------------------------------------------------

# the placeholders of the template languages definitions are generated from: Jinja ({{ x }}, {% ... %}),
# Python's str.format ({path}) and %-formatting (%(name)s), shell and Go/JS templates (${VAR})
# ERB/EJS (<% x %>) and autoconf/CMake substitutions (@VAR@)
PLACEHOLDER = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|\$\{[^}\s]+\}|%\([A-Za-z_]\w*\)[sdifr]|\{[A-Za-z_][\w.-]*\}"
                         r"|<%.*?%>|@[A-Z_][A-Z0-9_]*@")


def placeholders(text: str | None) -> list[str]:
    """The template placeholders in ``text``, in order (none in ordinary values, JSON included)."""
    return PLACEHOLDER.findall(text) if text and ("{" in text or "%" in text or "@" in text) else []
