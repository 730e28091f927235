"""Parse a QEMU command line into options and into a :class:`Guest`.

Accepts what users have: a ``.args`` file as libvirt writes it (environment
assignments, backslash continuations, shell quoting, JSON ``-device`` and
``-blockdev``), a plain one-line command, or ``/proc/PID/cmdline`` (NUL
separated). The effective settings are derived the way QEMU derives them,
e.g. a tap netdev has vhost off unless asked, so the rules see what runs.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from typing import Any

from kvmtune.errors import InputError
from kvmtune.model.guest import Disk, Guest, Nic, Rng
from kvmtune.qemu.blockdev import BlockGraph, ResolvedDisk, drive_tree, nest

_ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")

# options that take no argument (all others take exactly one)
_FLAGS = {
    "-S", "-nodefaults", "-no-user-config", "-no-shutdown", "-no-reboot", "-enable-kvm",
    "-nographic", "-snapshot", "-no-hpet", "-no-acpi", "-daemonize", "-no-fd-bootchk",
    "-enable-fips", "-full-screen", "-win2k-hack", "-old-param", "-no-kvm", "-s", "-preconfig",
    "-version", "-help", "-h", "-no-quit", "-usb", "-disable-ssp",
}

# the first bare word of these options is the value of this key
_IMPLIED_KEY = {
    "-device": "driver", "-netdev": "type", "-machine": "type", "-M": "type", "-cpu": "model",
    "-smp": "cpus", "-m": "size", "-object": "qom-type", "-accel": "accel", "-chardev": "backend",
    "-name": "guest", "-nic": "type", "-net": "type", "-blockdev": "driver",
}

BUS_OF_DEVICE = {
    "virtio-blk-pci": "virtio", "virtio-blk-ccw": "virtio", "virtio-blk-device": "virtio",
    "virtio-blk": "virtio", "virtio-blk-pci-non-transitional": "virtio",
    "virtio-blk-pci-transitional": "virtio", "vhost-user-blk-pci": "virtio",
    "ide-hd": "ide", "ide-cd": "ide", "ide-drive": "ide",
    "scsi-hd": "scsi", "scsi-cd": "scsi", "scsi-block": "scsi", "scsi-generic": "scsi", "scsi-disk": "scsi",
    "usb-storage": "usb", "usb-bot": "usb", "floppy": "fdc", "isa-fdc": "fdc", "sd-card": "sd",
    "nvme": "nvme", "nvme-ns": "nvme",
}

NIC_MODEL_OF_DEVICE = {
    "virtio-net-pci": "virtio", "virtio-net-ccw": "virtio", "virtio-net-device": "virtio",
    "virtio-net-pci-non-transitional": "virtio", "virtio-net-pci-transitional": "virtio", "virtio-net": "virtio",
    "e1000": "e1000", "e1000-82540em": "e1000", "e1000e": "e1000e", "rtl8139": "rtl8139",
    "ne2k_pci": "ne2k_pci", "ne2k_isa": "ne2k_isa", "pcnet": "pcnet", "vmxnet3": "vmxnet3",
    "i82551": "i82551", "i82557b": "i82557b", "i82559er": "i82559er", "usb-net": "usb-net",
    "spapr-vlan": "spapr-vlan",
}

# the short options that stand for a -drive (QEMU's drive_add with these interfaces)
_LEGACY_DRIVE_OPTIONS = {
    "-hda": "ide", "-hdb": "ide", "-hdc": "ide", "-hdd": "ide", "-cdrom": "ide", "-pflash": "pflash",
    "-fda": "floppy", "-fdb": "floppy", "-mtdblock": "mtd", "-sd": "sd",
}


@dataclass
class Option:
    name: str  # "-device"
    value: str | None
    index: int  # position among the options, for evidence
    props: dict[str, Any]

    @property
    def label(self) -> str:
        return f"{self.name} #{self.index}"


def split_args_text(text: str) -> list[str]:
    """Split a command line written as text (``.args`` file, a shell line or a small start script).

    Whole comment lines (``#!/bin/sh``, ``# notes``) are dropped and a leading ``exec`` is skipped,
    so a hand-written ``exec qemu-system-x86_64 \\ ...`` script reads as its command line.
    """
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    joined = re.sub(r"\\\r?\n", " ", text)
    try:
        words = shlex.split(joined, comments=False, posix=True)
    except ValueError as exc:
        raise ValueError(f"cannot split the command line: {exc}") from None
    while words and (_ENV_ASSIGN.match(words[0]) or words[0] == "exec") and not words[0].startswith("-"):
        words.pop(0)
    return words


def split_proc_cmdline(data: bytes) -> list[str]:
    return [w.decode("utf-8", "replace") for w in data.split(b"\0") if w]


def parse_keyval(text: str, implied: str | None = None) -> dict[str, Any]:
    """QEMU's ``key=value,key2=value2`` with ``,,`` as an escaped comma.

    A JSON object (``{...}``) is returned decoded. Dotted keys are kept flat
    (``cache.direct``), JSON objects are flattened the same way.
    """
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ValueError(f"invalid JSON option value: {exc.msg}") from None
        if not isinstance(data, dict):
            raise ValueError("JSON option value is not an object")
        return _flatten(data)
    parts: list[str] = []
    buf: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == ",":
            if i + 1 < len(text) and text[i + 1] == ",":
                buf.append(",")
                i += 2
                continue
            parts.append("".join(buf))
            buf = []
        else:
            buf.append(ch)
        i += 1
    parts.append("".join(buf))
    out: dict[str, Any] = {}
    for n, part in enumerate(parts):
        if not part:
            continue
        if "=" in part:
            key, val = part.split("=", 1)
            out[key] = val
        elif n == 0 and implied:
            out[implied] = part
        else:
            out[part] = "on"
    return out


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, val in data.items():
        full = f"{prefix}{key}"
        if isinstance(val, dict):
            out[full] = val  # keep the nested form too (blockdev "file" children)
            out.update(_flatten(val, full + "."))
        else:
            out[full] = val
    return out


def parse_options(argv: list[str]) -> tuple[str, list[Option]]:
    """Return (binary, options). Raises ValueError when this is no QEMU command line."""
    if not argv:
        raise ValueError("empty command line")
    binary = argv[0]
    base = binary.rsplit("/", 1)[-1]
    if not (base.startswith("qemu-system-") or base in ("qemu-kvm", "kvm") or base.startswith("qemu-kvm")):
        raise ValueError(f"not a QEMU system emulator command line (starts with {base!r})")
    options: list[Option] = []
    i = 1
    index = 0
    while i < len(argv):
        word = argv[i]
        if not word.startswith("-"):
            # a bare word is the disk image (qemu-system-x86_64 disk.img)
            options.append(Option("-hda", word, index, {"file": word}))
            i += 1
            index += 1
            continue
        name = "-" + word.lstrip("-")  # --device == -device
        if name in _FLAGS or i + 1 >= len(argv):
            options.append(Option(name, None, index, {}))
            i += 1
        else:
            value = argv[i + 1]
            props = parse_keyval(value, _IMPLIED_KEY.get(name)) if name in _IMPLIED_KEY or name in (
                "-drive", "-blockdev", "-overcommit", "-mem-prealloc", "-numa", "-global"
            ) else {}
            options.append(Option(name, value, index, props))
            i += 2
        index += 1
    return binary, options


def _on(value: Any) -> bool | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("on", "true", "yes", "1")


def _size_kib(text: str) -> int | None:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)[iI]?[bB]?\s*", str(text))
    if not m:
        return None
    num = float(m.group(1))
    unit = m.group(2).lower() or "m"  # QEMU: a bare -m number is MiB
    return int(num * {"k": 1, "m": 1024, "g": 1024**2, "t": 1024**3}[unit])


def effective_cache(direct: bool | None, no_flush: bool | None, write_cache: bool | None) -> str | None:
    """Map QEMU's cache.direct / cache.no-flush / write-cache to libvirt's cache names."""
    if direct is None and no_flush is None and write_cache is None:
        return None
    if no_flush:
        return "unsafe"
    wce = True if write_cache is None else write_cache
    if direct:
        return "none" if wce else "directsync"
    return "writeback" if wce else "writethrough"


# devices that hand SCSI commands to the host device (device='lun'): no host page cache in the data path
LUN_DEVICES = frozenset({"scsi-block"})


class _Storage:
    """The block side of one command line: -blockdev nodes and -drive options, by the names devices use."""

    def __init__(self) -> None:
        self.graph = BlockGraph()
        self.drives: dict[str, tuple[str, bool | None, Option]] = {}  # -drive id -> (top node, wce, option)

    def add_blockdev(self, opt: Option) -> None:
        try:
            opts = _node_options(opt.value or "")
        except ValueError:
            opts = nest(opt.props)
        self.graph.add_tree(opts, opt.label)

    def add_drive(self, opt: Option) -> str:
        tree, wce = drive_tree(opt.props)
        node = self.graph.add_tree(tree, opt.label)
        drive_id = str(opt.props.get("id", f"#drive{opt.index}"))
        self.drives[drive_id] = (node.name, wce, opt)
        return drive_id

    def resolve(self, ref: str) -> tuple[ResolvedDisk | None, Option | None]:
        """QEMU looks a device's drive= up as a -drive id first, then as a node name."""
        if ref in self.drives:
            node_name, wce, opt = self.drives[ref]
            resolved = self.graph.resolve(node_name)
            if resolved is not None:
                resolved.wce_default = wce
            return resolved, opt
        return self.graph.resolve(ref), None


def _node_options(value: str) -> dict[str, Any]:
    text = value.strip()
    if text.startswith("{"):
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not an object")
        return data
    return nest(parse_keyval(text, "driver"))


def _apply_resolved(disk: Disk, res: ResolvedDisk, write_cache: bool | None) -> None:
    wce = write_cache if write_cache is not None else res.wce_default
    disk.cache = effective_cache(res.direct, res.no_flush, wce)
    disk.io = res.aio
    disk.format = res.format
    disk.source = res.path
    disk.source_type = res.source_type
    disk.protocol = res.protocol
    disk.filters = list(res.filters)
    disk.discard = "unmap" if res.discard else None
    disk.detect_zeroes = res.detect_zeroes
    disk.readonly = disk.readonly or res.read_only


def guest_from_argv(argv: list[str], origin: str) -> Guest:
    try:
        binary, options = parse_options(argv)
    except ValueError as exc:
        raise InputError(origin, str(exc)) from None
    arch = binary.rsplit("qemu-system-", 1)[-1] if "qemu-system-" in binary else "x86_64"
    guest = Guest(name="?", origin=origin, origin_kind="cmdline", arch=arch)
    guest.vcpus = 1
    accel: str | None = None
    storage = _Storage()
    devices: list[Option] = []
    netdevs: dict[str, Option] = {}
    objects: dict[str, Option] = {}
    cpu_seen = False
    legacy_disks: list[tuple[str, Option]] = []

    for opt in options:
        p = opt.props
        if opt.name == "-name":
            guest.name = str(p.get("guest") or opt.value or "?")
        elif opt.name == "-uuid":
            guest.uuid = (opt.value or "").strip() or None
        elif opt.name == "-smbios" and guest.uuid is None:
            smbios = parse_keyval(opt.value or "")
            if smbios.get("type") == "1" and smbios.get("uuid"):
                guest.uuid = str(smbios["uuid"]).strip()  # Proxmox VE sets the VM's UUID here, not with -uuid
        elif opt.name in ("-machine", "-M"):
            guest.machine = str(p.get("type", "")).lower() or guest.machine
            if "accel" in p:
                accel = str(p["accel"]).split(":")[0]
            if _on(p.get("mem-merge")) is False:
                guest.nosharepages = True
                guest.evidence["memoryBacking"] = f"{opt.label} mem-merge=off"
            guest.evidence["machine"] = opt.label
        elif opt.name == "-accel":
            accel = accel or str(p.get("accel", ""))
        elif opt.name == "-enable-kvm":
            accel = "kvm"
        elif opt.name == "-cpu":
            cpu_seen = True
            model = str(p.get("model", "")).lower()
            guest.cpu_mode = {"host": "host-passthrough", "max": "maximum"}.get(model, "custom")
            guest.cpu_model = None if model in ("host", "max") else model
            guest.evidence["cpu"] = opt.label
        elif opt.name == "-smp":
            cpus = p.get("cpus")
            if cpus is None and "maxcpus" in p:
                cpus = p["maxcpus"]
            try:
                guest.vcpus = int(str(cpus)) if cpus is not None else guest.vcpus
            except ValueError:
                pass
            guest.evidence["vcpus"] = opt.label
        elif opt.name == "-m":
            size = p.get("size")
            if size is not None:
                guest.memory_kib = _size_kib(str(size))
            guest.evidence["memory"] = opt.label
        elif opt.name in ("-overcommit", "-realtime"):
            if _on(opt.props.get("mem-lock")) or _on(parse_keyval(opt.value or "").get("mlock")):
                guest.memory_locked = True
        elif opt.name == "-mem-path":
            if opt.value and "huge" in opt.value:
                guest.hugepages = True
        elif opt.name == "-object":
            oid = str(p.get("id", ""))
            objects[oid] = opt
            qom = str(p.get("qom-type", ""))
            if qom == "iothread":
                guest.iothreads += 1
            is_file_backend = qom in ("memory-backend-file", "memory-backend-memfd")
            if is_file_backend and ("huge" in str(p.get("mem-path", "")) or _on(p.get("hugetlb"))):
                guest.hugepages = True
                guest.evidence["memoryBacking"] = opt.label
            if qom.startswith("memory-backend") and _on(p.get("merge")) is False:
                guest.nosharepages = True
        elif opt.name == "-blockdev":
            storage.add_blockdev(opt)
        elif opt.name == "-drive":
            drive_id = storage.add_drive(opt)
            if str(p.get("if", "ide" if arch in ("x86_64", "i386") else "none")) != "none" or "id" not in p:
                legacy_disks.append((drive_id, opt))
        elif opt.name in _LEGACY_DRIVE_OPTIONS:
            iface = _LEGACY_DRIVE_OPTIONS[opt.name]
            props: dict[str, Any] = {"file": opt.value, "if": iface, "id": f"{opt.name[1:]}#{opt.index}"}
            if opt.name == "-cdrom":
                props["media"] = "cdrom"
            drive = Option("-drive", opt.value, opt.index, props)
            legacy_disks.append((storage.add_drive(drive), drive))
        elif opt.name == "-device":
            devices.append(opt)
        elif opt.name == "-netdev":
            netdevs[str(p.get("id", ""))] = opt
        elif opt.name == "-nic":
            nic = _nic_from_backend(len(guest.nics), opt, str(p.get("model", "e1000")))
            guest.nics.append(nic)

    base = binary.rsplit("/", 1)[-1]
    if accel is None and (base in ("kvm", "qemu-kvm") or base.startswith("qemu-kvm")):
        accel = "kvm"  # RHEL's qemu-kvm and Debian's kvm wrapper default to KVM
        guest.evidence["virt_type"] = f"({base} defaults to KVM)"
    guest.virt_type = "kvm" if accel in ("kvm",) else ("qemu" if accel in ("tcg", None) else accel)
    guest.evidence.setdefault("virt_type", "-accel" if accel else "(no -accel/-enable-kvm: QEMU uses TCG)")
    if not cpu_seen and guest.is_x86:
        guest.cpu_mode = "custom"
        guest.cpu_model = "qemu64"
        guest.evidence["cpu"] = "(no -cpu option: QEMU's default model)"

    scsi_controllers = {
        str(d.props.get("id")): (str(d.props.get("driver", "")).lower(), d.props.get("iothread"))
        for d in devices if "id" in d.props
    }
    balloon = False
    for dev in devices:
        p = dev.props
        drv = str(p.get("driver", "")).lower()
        if drv == "scsi-generic":
            continue  # SCSI host device passthrough (<hostdev type='scsi'>), not a disk
        if "drive" in p and drv in BUS_OF_DEVICE:
            guest.disks.append(_disk_from_device(dev, str(p["drive"]), storage, scsi_controllers, guest))
        elif drv.startswith("vhost-user-blk"):
            # served by an external process over a socket (<disk type='vhostuser'>): no QEMU block layer
            guest.disks.append(Disk(target=str(p.get("id", dev.label)), bus="virtio", source_type="vhostuser",
                                    protocol="vhost-user-blk", locator=dev.label))
        elif drv in NIC_MODEL_OF_DEVICE or "netdev" in p:
            backend = netdevs.get(str(p.get("netdev", "")))
            nic = _nic_from_backend(len(guest.nics), backend, drv, dev)
            guest.nics.append(nic)
        elif drv.startswith("vfio-") or drv in ("pci-assign", "kvm-pci-assign"):
            guest.hostdevs += 1
        elif drv.startswith("virtio-balloon"):
            balloon = True
            guest.balloon_free_page_reporting = _on(p.get("free-page-reporting")) is True
            guest.balloon_autodeflate = _on(p.get("deflate-on-oom")) is True
            guest.evidence["memballoon"] = dev.label
        elif drv.startswith("virtio-rng"):
            obj = objects.get(str(p.get("rng", "")))
            qom = str(obj.props.get("qom-type", "")) if obj else ""
            guest.rngs.append(
                Rng(
                    model="virtio",
                    backend_model={"rng-random": "random", "rng-builtin": "builtin", "rng-egd": "egd"}.get(qom, qom),
                    backend_source=str(obj.props.get("filename", "/dev/random")) if qom == "rng-random" and obj else None,
                    locator=dev.label,
                )
            )
    for drive_id, opt in legacy_disks:
        guest.disks.append(_disk_from_drive(drive_id, opt, storage, guest))
    guest.memballoon = "virtio" if balloon else "none"
    plugged = _hotplugged_memory_kib(devices, objects)
    if plugged and guest.memory_kib is not None:
        guest.memory_kib += plugged  # -m is the boot RAM; pc-dimm/nvdimm/virtio-mem add to it
        guest.evidence["memory"] = f"{guest.evidence.get('memory', '-m')} + memory devices"
    return guest


_MEMORY_DEVICES = ("pc-dimm", "nvdimm", "virtio-mem-pci", "virtio-mem-ccw", "virtio-mem-device", "virtio-pmem-pci")


def _hotplugged_memory_kib(devices: list[Option], objects: dict[str, Option]) -> int:
    total = 0
    for dev in devices:
        drv = str(dev.props.get("driver", "")).lower()
        if drv not in _MEMORY_DEVICES:
            continue
        if drv.startswith("virtio-mem"):
            size = dev.props.get("requested-size")  # what is plugged now, not the region's maximum
        else:
            backend = objects.get(str(dev.props.get("memdev", "")))
            size = backend.props.get("size") if backend is not None else None
        kib = _bytes_or_suffixed_kib(size)
        total += kib or 0
    return total


def _bytes_or_suffixed_kib(value: Any) -> int | None:
    """Object sizes: a bare number is bytes (unlike -m, where it is MiB)."""
    if value is None:
        return None
    text = str(value).strip()
    if text.isdigit():
        return int(text) // 1024
    return _size_kib(text)


def _disk_from_device(
    dev: Option,
    drive_ref: str,
    storage: _Storage,
    controllers: dict[str, tuple[str, Any]],
    guest: Guest,
) -> Disk:
    p = dev.props
    drv = str(p.get("driver", "")).lower()
    bus = BUS_OF_DEVICE[drv]
    if bus == "ide" and guest.machine and "q35" in guest.machine:
        bus = "sata"
    if drv in LUN_DEVICES:
        device = "lun"
    elif drv in ("ide-cd", "scsi-cd") or (drv == "scsi-disk" and str(p.get("media", "")).lower() == "cdrom"):
        device = "cdrom"
    else:
        device = "floppy" if bus == "fdc" else "disk"
    disk = Disk(
        target=str(p.get("id", drive_ref)),
        device=device,
        bus=bus,
        iothread=str(p["iothread"]) if "iothread" in p else ("mapped" if "iothread-vq-mapping" in p else None),
        locator=dev.label,
    )
    for key, attr in (("num-queues", "queues"), ("queue-size", "queue_size")):
        if str(p.get(key, "")).isdigit():
            setattr(disk, attr, int(str(p[key])))
            disk.evidence[attr] = f"{dev.label} {key}="
    if bus == "scsi":
        ctrl_id = str(p.get("bus", "scsi0.0")).split(".")[0]
        model, iothread = controllers.get(ctrl_id, ("default", None))
        disk.scsi_controller = ctrl_id
        disk.scsi_controller_model = model
        disk.scsi_controller_iothread = str(iothread) if iothread else None
        disk.evidence["controller"] = f"-device id={ctrl_id}"
    wc = str(p.get("write-cache", "auto")).lower()
    write_cache = None if wc == "auto" else _on(wc)
    resolved, drive_opt = storage.resolve(drive_ref)
    if resolved is not None:
        _apply_resolved(disk, resolved, write_cache)
        where = resolved.where if drive_opt is None else f"{drive_opt.label} (used by {dev.label})"
        disk.evidence.update({
            "cache": f"{where} cache + {dev.label} write-cache" if drive_opt is None else where,
            "io": where, "format": where, "source": where, "discard": where,
        })
    disk.evidence["bus"] = f"{dev.label} driver={drv}"
    disk.evidence["iothread"] = dev.label
    return disk


def _disk_from_drive(drive_id: str, opt: Option, storage: _Storage, guest: Guest) -> Disk:
    p = opt.props
    iface = str(p.get("if", "ide")).lower()
    bus = {"none": None, "mtd": "mtd", "pflash": "pflash", "floppy": "fdc"}.get(iface, iface)
    if bus == "ide" and guest.machine and "q35" in guest.machine:
        bus = "sata"
    if iface == "pflash":
        device = "firmware"  # the UEFI code or its variable store, not a guest data disk
    elif str(p.get("media", "")).lower() == "cdrom":
        device = "cdrom"
    else:
        device = "floppy" if bus == "fdc" else "disk"
    disk = Disk(target=str(p.get("id", f"drive{opt.index}")), device=device, bus=bus, locator=opt.label)
    resolved, _ = storage.resolve(drive_id)
    if resolved is not None:
        _apply_resolved(disk, resolved, None)
    disk.evidence = {k: f"{opt.label} {k}=" for k in ("cache", "io", "format", "discard")}
    disk.evidence["source"] = f"{opt.label} file="
    disk.evidence["bus"] = f"{opt.label} if={iface}"
    return disk


def _nic_from_backend(index: int, backend: Option | None, driver: str, device: Option | None = None) -> Nic:
    bp = backend.props if backend else {}
    dp = device.props if device else {}
    btype = str(bp.get("type", "")).lower() or None
    nic = Nic(index=index, model=NIC_MODEL_OF_DEVICE.get(driver.lower(), driver.lower()))
    nic.type = {"tap": "ethernet", "user": "user", "vhost-user": "vhostuser", "bridge": "bridge",
                "vhost-vdpa": "vdpa", "socket": "socket", "stream": "stream", "passt": "user"}.get(btype or "", btype)
    if btype == "passt" or (btype == "stream" and "passt" in str(bp.get("addr.path", ""))):
        nic.type, nic.backend = "user", "passt"
    if btype == "tap" or btype == "bridge":
        vhost = _on(bp.get("vhost"))
        nic.vhost = bool(vhost) or "vhostfd" in bp or "vhostfds" in bp
        nic.driver_name = "vhost" if nic.vhost else "qemu"
    elif btype == "vhost-user":
        nic.vhost = True
    if "queues" in bp:
        try:
            nic.queues = int(str(bp["queues"]))
        except ValueError:
            pass
    elif "fds" in bp:
        nic.queues = len(str(bp["fds"]).split(":"))
    nic.source = str(bp["br"]) if "br" in bp else (str(bp["ifname"]) if "ifname" in bp else None)
    if _on(dp.get("failover")):
        nic.teaming = "persistent"
    mac = dp.get("mac", bp.get("mac"))
    nic.mac = str(mac).lower() if mac else None
    for key in ("rx_queue_size", "tx_queue_size"):
        if str(dp.get(key, "")).isdigit():
            setattr(nic, key, int(str(dp[key])))
    mtu = dp.get("host_mtu")
    nic.mtu = int(str(mtu)) if mtu is not None and str(mtu).isdigit() else None
    where_dev = device.label if device else (backend.label if backend else "")
    where_back = backend.label if backend else where_dev
    nic.locator = where_dev
    nic.evidence = {
        "model": f"{where_dev} driver={driver}",
        "driver_name": f"{where_back} vhost=",
        "type": f"{where_back} type={btype}",
        "mac": f"{where_dev} mac=",
        "queues": f"{where_back} queues=",
        "mtu": f"{where_dev} host_mtu=",
        "rx_queue_size": f"{where_dev} rx_queue_size=",
        "tx_queue_size": f"{where_dev} tx_queue_size=",
    }
    return nic


def guest_from_text(text: str, origin: str) -> Guest:
    try:
        argv = split_args_text(text)
    except ValueError as exc:
        raise InputError(origin, str(exc)) from None
    return guest_from_argv(argv, origin)
