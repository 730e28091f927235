"""A Proxmox VE VM config (``/etc/pve/qemu-server/<vmid>.conf``) as ``qm.conf(5)`` documents it.

The file is ``key: value`` lines, split on ``\n`` only as PVE's ``parse_vm_config`` splits it: any other
line-break character (``\r``, ``\x0b``, ``\x0c``, ``\x1c``-``\x1e``, ``\x85``, U+2028, U+2029) stays inside its
value, so ``ciuser: bob<U+2028>scsi5: /dev/sda`` is one key to PVE and to kvmtune (a note says so; on a drive
or NIC key it is refused). ``#`` lines before the first section are the VM's description, each percent-encoded
(``PVE::Tools::encode_text``) and decoded here. A ``[name]`` line starts a
snapshot section, ``[PENDING]`` the changes PVE applies at the next start (with ``delete:`` naming the
keys to drop) and ``[special:cloudinit]`` the values the cloud-init drive was made from; only the part
before the first section is the current config. Values of disks and NICs are property strings:
``local:100/vm-100-disk-0.raw,cache=none,aio=native`` (the first, key-less item is the default key).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kvmtune.errors import InputError

_LINE = re.compile(r"^([a-z][a-z0-9_-]*):[ \t]*(.*?)[ \t]*$")
# what str.splitlines() splits on beside \n; PVE does not, so each is part of a value
LINE_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_BREAK = re.compile(f"[{LINE_BREAKS}]")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
ASCII_SPACE = " \t\r\x0b\x0c"  # what Perl's \s strips from a line PVE reads as bytes
_SECTION = re.compile(r"^\[([A-Za-z0-9_:.-]+)\]\s*$")
VMID_FILE = re.compile(r"^([1-9][0-9]{2,8})\.conf$")  # qm.conf(5): VMIDs are 100 ... 999999999

# disk keys (qm.conf(5) "ide[n]", "sata[n]", "scsi[n]", "virtio[n]", "efidisk0", "tpmstate0") -> bus
DISK_KEY = re.compile(r"^(ide[0-3]|sata[0-5]|scsi(?:[0-9]|[12][0-9]|30)|virtio(?:[0-9]|1[0-5])|efidisk0|tpmstate0)$")
NET_KEY = re.compile(r"^net([0-9]|[1-2][0-9]|3[01])$")

# the properties a drive accepts (qm.conf(5), "ide[n]" … "virtio[n]"), with the values of the enumerated ones
DRIVE_ENUMS: dict[str, frozenset[str]] = {
    "cache": frozenset({"none", "writethrough", "writeback", "unsafe", "directsync"}),
    "aio": frozenset({"native", "threads", "io_uring"}),
    "discard": frozenset({"on", "ignore"}),
    "media": frozenset({"disk", "cdrom"}),
    "format": frozenset({"raw", "cow", "qcow", "qed", "qcow2", "vmdk", "cloop"}),
    "werror": frozenset({"enospc", "ignore", "report", "stop"}),
    "rerror": frozenset({"ignore", "report", "stop"}),
    "trans": frozenset({"none", "lba", "auto"}),
}
DRIVE_BOOLS = frozenset({"iothread", "ssd", "backup", "replicate", "ro", "shared", "detect_zeroes", "snapshot",
                         "scsiblock", "efitype-2m", "pre-enrolled-keys"})
DRIVE_OTHER = frozenset({
    "file", "size", "serial", "wwn", "model", "product", "vendor", "cyls", "heads", "secs", "queues", "boot",
    "import-from", "efitype", "version", "mbps", "mbps_rd", "mbps_wr", "mbps_max", "mbps_rd_max", "mbps_wr_max",
    "iops", "iops_rd", "iops_wr", "iops_max", "iops_rd_max", "iops_wr_max", "iops_max_length",
    "iops_rd_max_length", "iops_wr_max_length", "bps", "bps_rd", "bps_wr", "bps_max_length",
    "bps_rd_length", "bps_wr_length", "mbps_max_length", "mbps_rd_max_length", "mbps_wr_max_length",
})
SCSIHW = frozenset({"lsi", "lsi53c810", "virtio-scsi-pci", "virtio-scsi-single", "megasas", "pvscsi"})
OSTYPES = frozenset({"other", "wxp", "w2k", "w2k3", "w2k8", "wvista", "win7", "win8", "win10", "win11", "l24", "l26",
                     "solaris"})
NIC_MODELS = frozenset({"e1000", "e1000-82540em", "e1000-82544gc", "e1000-82545em", "e1000e", "i82551", "i82557b",
                        "i82559er", "ne2k_isa", "ne2k_pci", "pcnet", "rtl8139", "virtio", "vmxnet3"})
NIC_OTHER = frozenset({"bridge", "firewall", "link_down", "macaddr", "model", "mtu", "queues", "rate", "tag", "trunks"})


def split_property_string(text: str) -> list[tuple[str | None, str]]:
    """``a,b=c,d=e`` -> [(None, a), (b, c), (d, e)]: the items of a property string in order."""
    items: list[tuple[str | None, str]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, eq, value = part.partition("=")
        items.append((key.strip(), value.strip()) if eq else (None, part))
    return items


def format_property_string(items: list[tuple[str | None, str]]) -> str:
    return ",".join(value if key is None else f"{key}={value}" for key, value in items)


@dataclass
class PveConfig:
    """One VM config: the current values, the pending ones, and the names of its snapshots."""

    vmid: str
    path: str
    current: dict[str, str] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)  # key -> its line in the file
    description: str = ""
    pending: dict[str, str] = field(default_factory=dict)
    pending_delete: list[str] = field(default_factory=list)
    snapshots: list[str] = field(default_factory=list)
    node: str | None = None  # /etc/pve/nodes/<node>/qemu-server: the cluster node that runs it
    peers: tuple[str, ...] = ()  # the cluster's other nodes (/etc/pve/nodes/), where it may migrate to
    notes: list[str] = field(default_factory=list)  # what a reader should know (a value with a line break)

    def where(self, key: str) -> str:
        line = self.lines.get(key)
        return f"{self.path}:{line} {key}" if line else f"{self.path} ({key} not set)"


def pve_lines(text: str) -> list[str]:
    """The lines of a config as PVE splits it: on ``\n`` only (``split(/\n/, $raw)``), each without its ``\n``."""
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def decode_text(text: str) -> str:
    """``PVE::Tools::decode_text``: ``%XX`` escapes to bytes, read as UTF-8."""
    data = re.sub(rb"%([0-9a-fA-F]{2})", lambda m: bytes([int(m.group(1), 16)]), text.encode("utf-8"))
    return data.decode("utf-8", "replace")


def break_characters(value: str) -> str:
    """The line-break characters (other than ``\n``) in ``value``, escaped for a message: ``'\\u2028'``."""
    return ", ".join(dict.fromkeys(f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"
                                   for c in _BREAK.findall(value)))


def parse_config(text: str, path: str, vmid: str) -> PveConfig:
    """Read a config the way PVE's ``parse_vm_config`` does; a line or a drive PVE would not accept, or a key
    set twice in the current section, is an :class:`InputError` naming the file, the line and the problem."""
    cfg = PveConfig(vmid=vmid, path=path)
    section = ""
    target = cfg.current
    description: list[str] = []
    for number, raw in enumerate(pve_lines(text), 1):
        line = raw.strip(ASCII_SPACE)
        if not line:
            continue
        if line.startswith("#"):
            if not section:
                description.append(decode_text(line[1:]))
            continue
        if m := _SECTION.match(line):
            section = m.group(1)
            if section == "PENDING":
                target = cfg.pending
            else:
                target = {}
                if not section.startswith("special:"):
                    cfg.snapshots.append(section)
            continue
        m = _LINE.match(line)
        if m is None:
            raise InputError(path, f"not a 'key: value' line: {line[:60]!r}", number)
        key, value = m.group(1), m.group(2)
        if section == "PENDING" and key == "delete":
            cfg.pending_delete = [k.lstrip("!") for k in value.split(",") if k]
            continue
        if target is cfg.current:
            if key in cfg.lines:
                raise InputError(path, f"{key} is set twice (first on line {cfg.lines[key]}); PVE would take the "
                                 "last, kvmtune takes neither", number)
            check_value(key, value, path, number)
            cfg.lines[key] = number
            if _BREAK.search(value):
                cfg.notes.append(f"{path}:{number}: {key} holds a line-break character ({break_characters(value)}) "
                                 "that PVE does not split on: one value, not a line")
        elif (DISK_KEY.match(key) or NET_KEY.match(key)) and _CONTROL.search(value):
            raise InputError(path, f"{key}: a control or line-break character in a drive or NIC value", number)
        target[key] = value
    cfg.description = "\n".join(description)
    return cfg


def check_value(key: str, value: str, path: str, line: int | None = None) -> None:
    """What ``qm start`` would refuse ("unable to parse drive options", an unknown ``scsihw`` or ``ostype``), and a
    drive or NIC value holding a control or line-break character (kvmtune would hand it back to ``qm set``)."""
    if (DISK_KEY.match(key) or NET_KEY.match(key)) and _CONTROL.search(value):
        raise InputError(path, f"{key}: a control or line-break character in a drive or NIC value", line)
    if DISK_KEY.match(key):
        _check_drive(key, value, path, line)
    elif NET_KEY.match(key):
        _check_net(key, value, path, line)
    elif key == "scsihw" and value not in SCSIHW:
        raise InputError(path, f"scsihw: {value!r} is not one of {', '.join(sorted(SCSIHW))}", line)
    elif key == "ostype" and value not in OSTYPES:
        raise InputError(path, f"ostype: {value!r} is not one of {', '.join(sorted(OSTYPES))}", line)
    elif key in ("memory", "cores", "sockets", "vcpus", "balloon") and not re.fullmatch(r"[0-9]+|current=[0-9]+", value):
        raise InputError(path, f"{key}: {value!r} is not a number", line)


def _check_drive(key: str, value: str, path: str, line: int | None) -> None:
    items = split_property_string(value)
    if not items or items[0][0] not in (None, "file"):
        raise InputError(path, f"{key}: no volume (the first item names the storage volume or path)", line)
    for name, val in items[1:]:
        if name is None:
            raise InputError(path, f"{key}: unable to parse drive options: {val!r} has no '='", line)
        if name in DRIVE_ENUMS:
            if val not in DRIVE_ENUMS[name]:
                raise InputError(path, f"{key}: {name}={val!r} is not one of {', '.join(sorted(DRIVE_ENUMS[name]))}",
                                 line)
        elif name in DRIVE_BOOLS:
            if val not in ("0", "1", "on", "off", "yes", "no", "true", "false"):
                raise InputError(path, f"{key}: {name}={val!r} is not a boolean (0 or 1)", line)
        elif name not in DRIVE_OTHER:
            raise InputError(path, f"{key}: unable to parse drive options: unknown property {name!r}", line)


def _check_net(key: str, value: str, path: str, line: int | None) -> None:
    for name, val in split_property_string(value):
        if name is None:
            if val not in NIC_MODELS:
                raise InputError(path, f"{key}: {val!r} is not a NIC model", line)
        elif name not in NIC_MODELS and name not in NIC_OTHER:
            raise InputError(path, f"{key}: unable to parse network options: unknown property {name!r}", line)


def pve_bool(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "on", "yes", "true")


def drive_props(value: str) -> tuple[str, dict[str, str]]:
    """A drive's volume and its other properties."""
    items = split_property_string(value)
    volume = items[0][1] if items else ""
    return volume, {k: v for k, v in items[1:] if k is not None}
