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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvmtune.errors import InputError
from kvmtune.host.root import HostRoot
from kvmtune.model.guest import Disk, Guest, Nic, Rng
from kvmtune.model.values import (
    BUS_OF_DEVICE,
    BUS_OF_DRIVE_IF,
    LUN_DEVICES,
    NIC_MODEL_OF_DEVICE,
    NIC_TYPE_OF_NETDEV,
    RNG_BACKEND_OF_OBJECT,
    cache_mode,
    machine_bus,
    placeholders,
    qemu_bool,
    qemu_object_kib,
    qemu_size_kib,
)
from kvmtune.qemu.argv import DEFAULT_BINARY, LEGACY_DRIVE_OPTIONS, Option, parse_keyval, parse_options, split_args_text
from kvmtune.qemu.blockdev import BlockGraph, ResolvedDisk, drive_tree, nest
from kvmtune.qemu.readconfig import DEVICE_ONLY_FILES, ConfigFile, read_config
from kvmtune.qemuopts import Aio, Cache, DetectZeroes, Discard

# the cache mode QEMU's cache options amount to, under the name outside tools know
effective_cache = cache_mode


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
    disk.cache = disk.take("cache", Cache, cache_mode(res.direct, res.no_flush, wce))
    disk.io = disk.take("io", Aio, res.aio)
    disk.format = res.format
    disk.source = res.path
    disk.source_type = res.source_type
    disk.protocol = res.protocol
    disk.filters = list(res.filters)
    disk.discard = Discard.UNMAP if res.discard else None
    disk.detect_zeroes = disk.take("detect_zeroes", DetectZeroes, res.detect_zeroes)
    disk.readonly = disk.readonly or res.read_only


@dataclass
class _Reading:
    """What reading one command line gathers besides the guest, for the devices and checks that need all options."""

    guest: Guest
    binary: str
    accel: str | None = None
    cpu_seen: bool = False
    balloon: bool = False
    storage: _Storage = field(default_factory=_Storage)
    devices: list[Option] = field(default_factory=list)
    netdevs: dict[str, Option] = field(default_factory=dict)
    objects: dict[str, Option] = field(default_factory=dict)
    legacy_disks: list[tuple[str, Option]] = field(default_factory=list)  # (-drive id, option): disks without -device
    scsi_controllers: dict[str, tuple[str, Any]] = field(default_factory=dict)  # -device id -> (driver, iothread)


# --- options: one reader per option (or family of options) ---------------------------------------

def _read_name(r: _Reading, opt: Option) -> None:
    r.guest.name = str(opt.props.get("guest") or opt.value or "?")


def _read_pve_id(r: _Reading, opt: Option) -> None:
    r.guest.derived["pve_vmid"] = (opt.value or "").strip()  # Proxmox VE's -id <vmid>: which config it runs


_PVE_PIDFILE = re.compile(r"^/(?:var/)?run/qemu-server/([1-9][0-9]{2,8})\.pid$")


def _read_pve_pidfile(r: _Reading, opt: Option) -> None:
    """Proxmox VE's ``-pidfile /var/run/qemu-server/<vmid>.pid`` names the config too (``-id`` wins where both are)."""
    m = _PVE_PIDFILE.match((opt.value or "").strip())
    if m:
        r.guest.derived.setdefault("pve_vmid", m.group(1))


def _read_uuid(r: _Reading, opt: Option) -> None:
    r.guest.uuid = (opt.value or "").strip() or None


def _read_smbios(r: _Reading, opt: Option) -> None:
    if r.guest.uuid is not None:
        return
    smbios = parse_keyval(opt.value or "")
    if smbios.get("type") == "1" and smbios.get("uuid"):
        r.guest.uuid = str(smbios["uuid"]).strip()  # Proxmox VE sets the VM's UUID here, not with -uuid


def _read_machine(r: _Reading, opt: Option) -> None:
    p, guest = opt.props, r.guest
    guest.machine = str(p.get("type", "")).lower() or guest.machine
    if "accel" in p:
        r.accel = str(p["accel"]).split(":")[0]
    if qemu_bool(p.get("mem-merge")) is False:
        guest.nosharepages = True
        guest.evidence["memoryBacking"] = f"{opt.label} mem-merge=off"
    guest.evidence["machine"] = opt.label


def _read_accel(r: _Reading, opt: Option) -> None:
    r.accel = r.accel or str(opt.props.get("accel", ""))


def _read_enable_kvm(r: _Reading, opt: Option) -> None:
    r.accel = "kvm"


def _read_cpu(r: _Reading, opt: Option) -> None:
    r.cpu_seen = True
    model = str(opt.props.get("model", "")).lower()
    r.guest.cpu_mode = {"host": "host-passthrough", "max": "maximum"}.get(model, "custom")
    r.guest.cpu_model = None if model in ("host", "max") else model
    r.guest.evidence["cpu"] = opt.label


def _read_smp(r: _Reading, opt: Option) -> None:
    cpus = opt.props.get("cpus")
    if cpus is None and "maxcpus" in opt.props:
        cpus = opt.props["maxcpus"]
    try:
        r.guest.vcpus = int(str(cpus)) if cpus is not None else r.guest.vcpus
    except ValueError:
        pass
    r.guest.evidence["vcpus"] = opt.label


def _read_memory(r: _Reading, opt: Option) -> None:
    size = opt.props.get("size")
    if size is not None:
        r.guest.memory_kib = qemu_size_kib(str(size))
    r.guest.evidence["memory"] = opt.label


def _read_mem_lock(r: _Reading, opt: Option) -> None:
    if qemu_bool(opt.props.get("mem-lock")) or qemu_bool(parse_keyval(opt.value or "").get("mlock")):
        r.guest.memory_locked = True


def _read_mem_path(r: _Reading, opt: Option) -> None:
    if opt.value and "huge" in opt.value:
        r.guest.hugepages = True


def _read_rtc(r: _Reading, opt: Option) -> None:
    """-rtc base=utc|localtime|<date>: libvirt's clock offset utc, localtime or (a start date) variable."""
    base = str((opt.props or parse_keyval(opt.value or "")).get("base", "utc")).strip().lower()
    r.guest.clock_offset = base if base in ("utc", "localtime") else "variable"
    r.guest.evidence["clock"] = opt.label


def _read_object(r: _Reading, opt: Option) -> None:
    p, guest = opt.props, r.guest
    r.objects[str(p.get("id", ""))] = opt
    qom = str(p.get("qom-type", ""))
    if qom == "iothread":
        guest.iothreads += 1
    is_file_backend = qom in ("memory-backend-file", "memory-backend-memfd")
    if is_file_backend and ("huge" in str(p.get("mem-path", "")) or qemu_bool(p.get("hugetlb"))):
        guest.hugepages = True
        guest.evidence["memoryBacking"] = opt.label
    if qom.startswith("memory-backend") and qemu_bool(p.get("merge")) is False:
        guest.nosharepages = True


def _read_blockdev(r: _Reading, opt: Option) -> None:
    r.storage.add_blockdev(opt)


def _read_drive(r: _Reading, opt: Option) -> None:
    drive_id = r.storage.add_drive(opt)
    default_if = "ide" if r.guest.arch in ("x86_64", "i386") else "none"
    if str(opt.props.get("if", default_if)) != "none" or "id" not in opt.props:
        r.legacy_disks.append((drive_id, opt))


def _read_legacy_drive(r: _Reading, opt: Option) -> None:
    """-hda, -cdrom, -pflash, ...: a -drive with that interface."""
    props: dict[str, Any] = {"file": opt.value, "if": LEGACY_DRIVE_OPTIONS[opt.name], "id": f"{opt.name[1:]}#{opt.index}"}
    if opt.name == "-cdrom":
        props["media"] = "cdrom"
    drive = Option("-drive", opt.value, opt.index, props)
    r.legacy_disks.append((r.storage.add_drive(drive), drive))


def _read_device(r: _Reading, opt: Option) -> None:
    r.devices.append(opt)  # read once every option is known: devices name drives, netdevs and objects


def _read_netdev(r: _Reading, opt: Option) -> None:
    r.netdevs[str(opt.props.get("id", ""))] = opt


def _read_legacy_balloon(r: _Reading, opt: Option) -> None:
    """``-balloon virtio[,addr=...]``: QEMU's old spelling of ``-device virtio-balloon-pci`` (removed in
    QEMU 4.0, still in older generators' command lines); ``-balloon none`` adds nothing."""
    if str(opt.props.get("model", "")).lower() == "virtio":
        r.balloon = True
        r.guest.evidence["memballoon"] = f"{opt.label} virtio"


def _read_nic(r: _Reading, opt: Option) -> None:
    r.guest.nics.append(_nic_from_backend(len(r.guest.nics), opt, str(opt.props.get("model", "e1000"))))


OptionReader = Callable[[_Reading, Option], None]
# option -> its reader, called in command-line order (later options override earlier ones, as in QEMU)
OPTION_READERS: dict[str, OptionReader] = {
    "-name": _read_name,
    "-uuid": _read_uuid,
    "-id": _read_pve_id,
    "-pidfile": _read_pve_pidfile,
    "-smbios": _read_smbios,
    "-machine": _read_machine,
    "-M": _read_machine,
    "-accel": _read_accel,
    "-enable-kvm": _read_enable_kvm,
    "-cpu": _read_cpu,
    "-smp": _read_smp,
    "-m": _read_memory,
    "-overcommit": _read_mem_lock,
    "-realtime": _read_mem_lock,
    "-mem-path": _read_mem_path,
    "-rtc": _read_rtc,
    "-object": _read_object,
    "-blockdev": _read_blockdev,
    "-drive": _read_drive,
    **dict.fromkeys(LEGACY_DRIVE_OPTIONS, _read_legacy_drive),
    "-device": _read_device,
    "-netdev": _read_netdev,
    "-nic": _read_nic,
    "-balloon": _read_legacy_balloon,
}


# --- devices: one reader per kind of -device, named after libvirt's element ---------------------

def _device_kind(drv: str, props: dict[str, Any]) -> str | None:
    """Which reader a ``-device`` goes to (the first that claims it); ``None``: none of kvmtune's business."""
    if drv == "scsi-generic":
        return None  # SCSI host device passthrough (<hostdev type='scsi'>), not a disk
    if "drive" in props and drv in BUS_OF_DEVICE:
        return "disk"
    if drv.startswith("vhost-user-blk"):
        return "vhostuser-disk"
    if drv in NIC_MODEL_OF_DEVICE or "netdev" in props:
        return "interface"
    if drv.startswith("vfio-") or drv in ("pci-assign", "kvm-pci-assign"):
        return "hostdev"
    if drv.startswith("virtio-balloon"):
        return "memballoon"
    if drv.startswith("virtio-rng"):
        return "rng"
    return None


def _read_disk_device(r: _Reading, dev: Option, drv: str) -> None:
    r.guest.disks.append(_disk_from_device(dev, str(dev.props["drive"]), r.storage, r.scsi_controllers, r.guest))


def _read_vhostuser_disk(r: _Reading, dev: Option, drv: str) -> None:
    # served by an external process over a socket (<disk type='vhostuser'>): no QEMU block layer
    r.guest.disks.append(Disk(target=str(dev.props.get("id", dev.label)), bus="virtio", source_type="vhostuser",
                              protocol="vhost-user-blk", locator=dev.label))


def _read_nic_device(r: _Reading, dev: Option, drv: str) -> None:
    backend = r.netdevs.get(str(dev.props.get("netdev", "")))
    r.guest.nics.append(_nic_from_backend(len(r.guest.nics), backend, drv, dev))


def _read_hostdev(r: _Reading, dev: Option, drv: str) -> None:
    r.guest.hostdevs += 1


def _read_balloon(r: _Reading, dev: Option, drv: str) -> None:
    r.balloon = True
    r.guest.balloon_free_page_reporting = qemu_bool(dev.props.get("free-page-reporting")) is True
    r.guest.balloon_autodeflate = qemu_bool(dev.props.get("deflate-on-oom")) is True
    r.guest.evidence["memballoon"] = dev.label


def _read_rng(r: _Reading, dev: Option, drv: str) -> None:
    obj = r.objects.get(str(dev.props.get("rng", "")))
    qom = str(obj.props.get("qom-type", "")) if obj else ""
    r.guest.rngs.append(
        Rng(
            model="virtio",
            backend_model=RNG_BACKEND_OF_OBJECT.get(qom, qom),
            backend_source=str(obj.props.get("filename", "/dev/random")) if qom == "rng-random" and obj else None,
            locator=dev.label,
            index=len(r.guest.rngs),
        )
    )


DeviceReader = Callable[[_Reading, Option, str], None]
# kind of -device (_device_kind) -> its reader, called with the device and its driver name in lower case
DEVICE_READERS: dict[str, DeviceReader] = {
    "disk": _read_disk_device,
    "vhostuser-disk": _read_vhostuser_disk,
    "interface": _read_nic_device,
    "hostdev": _read_hostdev,
    "memballoon": _read_balloon,
    "rng": _read_rng,
}


# --- what QEMU derives from the whole command line -----------------------------------------------

def _settle_accel(r: _Reading) -> None:
    guest, base = r.guest, r.binary.rsplit("/", 1)[-1]
    if r.accel is None and guest.unread:  # an unread -readconfig file may name it: not stated, not TCG
        guest.evidence["virt_type"] = "(not stated: " + ", ".join(guest.unread) + " not read)"
        return
    if r.accel is None and (base in ("kvm", "qemu-kvm") or base.startswith("qemu-kvm")):
        r.accel = "kvm"  # RHEL's qemu-kvm and Debian's kvm wrapper default to KVM
        guest.evidence["virt_type"] = f"({base} defaults to KVM)"
    guest.virt_type = "kvm" if r.accel in ("kvm",) else ("qemu" if r.accel in ("tcg", None) else r.accel)
    guest.evidence.setdefault("virt_type", "-accel" if r.accel else "(no -accel/-enable-kvm: QEMU uses TCG)")


def _settle_cpu(r: _Reading) -> None:
    if not r.cpu_seen and r.guest.is_x86 and not r.guest.unread:
        r.guest.cpu_mode = "custom"
        r.guest.cpu_model = "qemu64"
        r.guest.evidence["cpu"] = "(no -cpu option: QEMU's default model)"


def _read_devices(r: _Reading) -> None:
    r.scsi_controllers = {
        str(d.props.get("id")): (str(d.props.get("driver", "")).lower(), d.props.get("iothread"))
        for d in r.devices if "id" in d.props
    }
    for dev in r.devices:
        drv = str(dev.props.get("driver", "")).lower()
        kind = _device_kind(drv, dev.props)
        if kind is not None:
            DEVICE_READERS[kind](r, dev, drv)
    for drive_id, opt in r.legacy_disks:
        r.guest.disks.append(_disk_from_drive(drive_id, opt, r.storage, r.guest))
    r.guest.memballoon = "virtio" if r.balloon else (None if r.guest.unread else "none")
    if not r.balloon and not r.guest.unread:
        r.guest.evidence["memballoon"] = "(no -device virtio-balloon-* or -balloon virtio option)"


def _settle_memory(r: _Reading) -> None:
    """-m is the boot RAM; pc-dimm and virtio-mem add hotplugged RAM to it, nvdimm and virtio-pmem are device
    memory (``Guest.device_memory_kib``), never RAM."""
    guest = r.guest
    plugged, device = _memory_devices_kib(r.devices, r.objects)
    guest.device_memory_kib = device
    if plugged and guest.memory_kib is not None:
        guest.memory_kib += plugged
        guest.evidence["memory"] = f"{guest.evidence.get('memory', '-m')} + hotplugged memory devices"


def guest_from_argv(argv: list[str], origin: str, default_binary: str | None = None,
                    host: HostRoot | None = None) -> Guest:
    """The guest ``argv`` starts; with ``default_binary``, an argument list without the binary is that binary's
    (the guest's ``derived["binary_assumed"]`` says so). ``-readconfig`` files are read beneath ``host``'s root;
    without ``host``, or when one cannot be read, the guest says so (``Guest.unread``)."""
    try:
        binary, options = parse_options(argv, default_binary)
    except ValueError as exc:
        raise InputError(origin, str(exc)) from None
    arch = binary.rsplit("qemu-system-", 1)[-1] if "qemu-system-" in binary else "x86_64"
    r = _Reading(Guest(name="?", origin=origin, origin_kind="cmdline", arch=arch, vcpus=1), binary)
    if binary != argv[0]:
        r.guest.derived["binary_assumed"] = binary
    try:
        expanded = _with_config_files(r.guest, options, host)
        guest = _read_guest(r, expanded, argv)
        _recognise_instance(r, options)
    except RecursionError:
        # another user's QEMU may carry it: a -drive file=json:[[[... the option reader never decodes, or a -blockdev
        # just shallow enough for it and too deep for a reader further down the stack; that guest, not the run
        raise InputError(origin, "JSON option value nested too deeply to read") from None
    return guest


def guest_from_config(config: ConfigFile, origin: str) -> Guest:
    """A ``-readconfig`` file given on its own: a fragment of a guest, audited with the same rules, its command
    line not read (so nothing is judged on what the file leaves out)."""
    r = _Reading(Guest(name="?", origin=origin, origin_kind="cmdline", arch="x86_64", vcpus=1), DEFAULT_BINARY)
    r.guest.unread = ("the command line that reads this configuration file",)
    r.guest.derived["notes"] = list(config.notes)
    return _read_guest(r, _config_options(config, 0), [])


def _config_options(config: ConfigFile, index: int) -> list[Option]:
    return [Option(s.option, None, index, s.props, s.where) for s in config.sections]


def _with_config_files(guest: Guest, options: list[Option], host: HostRoot | None) -> list[Option]:
    """``options`` with each ``-readconfig`` replaced by its file's sections, where it stands (QEMU applies a
    file's options there: earlier options are overridden by it, later ones override it)."""
    if not any(o.name == "-readconfig" for o in options):
        return options
    out: list[Option] = []
    notes: list[str] = guest.derived.setdefault("notes", [])
    for opt in options:
        if opt.name != "-readconfig":
            out.append(opt)
            continue
        value = opt.value or ""
        if host is None:
            if value in DEVICE_ONLY_FILES:
                notes.append(f"-readconfig {value}: not read here; qemu-server's own file (USB, PCI bridges and "
                             "PCIe root ports only): no finding withheld")
                continue
            guest.unread += (f"-readconfig {value}",)
            notes.append(f"-readconfig {value}: not read here; findings on what the file may hold are withheld")
            continue
        try:
            config, note = read_config(value, host)
        except InputError as exc:
            if value in DEVICE_ONLY_FILES:
                notes.append(f"-readconfig {exc.where}: not read ({exc.problem}); qemu-server's own file (USB, PCI "
                             "bridges and PCIe root ports only): no finding withheld")
                continue
            guest.unread += (f"-readconfig {value}",)
            notes.append(f"-readconfig {exc.where}: not read ({exc.problem}); findings on what the file may hold "
                         "(no accelerator, no balloon, no RNG, ...) are withheld")
            continue
        notes.extend([f"-readconfig {config.path}: read, {len(config.sections)} section(s)",
                      *([note] if note else []), *config.notes])
        guest.derived.setdefault("config_files", []).append(config.path)
        out.extend(_config_options(config, opt.index))
    return out


# where LXD and Incus keep an instance's QEMU configuration file: .../lxd/logs/<instance>/qemu.conf (the snap),
# /var/log/{lxd,incus}/<instance>/qemu.conf, /run/incus/<instance>/qemu.conf
INSTANCE_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}"  # what an instance or device name may be, in a path or a fix text
_INSTANCE_CONFIG = re.compile(rf"/(lxd|incus)/(?:logs/)?({INSTANCE_NAME})/qemu\.conf$")
_INSTANCE_PRODUCT = re.compile(r"(?:^|,)product=(LXD|Incus)(?:,|$)")


def _recognise_instance(r: _Reading, options: list[Option]) -> None:
    """An LXD or Incus VM (its -readconfig path, or the SMBIOS product it sets) is named by its instance:
    ``incus:<instance>`` (``derived["instance"]``: (manager, instance), for fix texts in their CLI)."""
    manager = instance = None
    for opt in options:
        value = opt.value or ""
        if opt.name == "-readconfig" and (m := _INSTANCE_CONFIG.search(value)):
            manager, instance = m.group(1), instance or m.group(2)
        elif opt.name == "-smbios" and (m := _INSTANCE_PRODUCT.search(value)):
            manager = manager or m.group(1).lower()
    if manager is None:
        return
    if r.guest.name != "?" and re.fullmatch(INSTANCE_NAME, r.guest.name):
        instance = r.guest.name  # -name is the instance; the directory adds the project (<project>_<instance>)
    # a -name outside the name syntax (another user's process chose it) never reaches the manager's command line
    if instance:
        r.guest.derived["instance"] = (manager, instance)
        r.guest.name = f"{manager}:{instance}"


def _read_guest(r: _Reading, options: list[Option], argv: list[str]) -> Guest:
    for opt in options:
        read = OPTION_READERS.get(opt.name)
        if read is not None:
            read(r, opt)
    _settle_accel(r)
    _settle_cpu(r)
    _read_devices(r)
    _settle_memory(r)
    for attr, absent in _ABSENT_EVIDENCE.items():  # a rule citing a default cites the option that is not there
        r.guest.evidence.setdefault(attr, absent)
    from_files = [str(v) for opt in options if opt.where for v in opt.props.values()]
    r.guest.template = tuple(dict.fromkeys(p for word in (*argv, *from_files) for p in placeholders(word)))
    if r.guest.template:
        judged = _judged_placeholder(options)
        if judged is not None:
            r.guest.derived["template_judged"] = judged
        r.guest.forget_placeholders()
    return r.guest


# options whose value names something (a guest, a file, a socket, a display): a placeholder there changes no
# finding; and the keys of the others that do the same
_NAMING_OPTIONS = frozenset({
    "-name", "-uuid", "-pidfile", "-D", "-runas", "-kernel", "-initrd", "-append", "-bios", "-L", "-vnc", "-spice",
    "-serial", "-monitor", "-qmp", "-mon", "-chardev", "-readconfig", "-smbios", "-display", "-sandbox", "-boot",
    "-k", "-loadvm", "-id", "-parallel", "-incoming", "-fsdev", "-virtfs", "-trace", "-msg", "-sd", "-pflash",
    *LEGACY_DRIVE_OPTIONS,
})
_NAMING_KEYS = frozenset({
    "file", "filename", "path", "ifname", "br", "mac", "id", "node-name", "script", "downscript", "guest", "chardev",
    "netdev", "drive", "bus", "addr", "serial", "wwn", "fd", "fds", "vhostfd", "vhostfds", "hostfwd", "sock",
    "socket", "addr.path", "server", "bootindex", "romfile", "file.filename", "file.path", "memdev", "rng", "iothread",
    "host", "sysfsdev", "rombar", "x-pci-sub-device-id", "serial-number",
})


def _judged_placeholder(options: list[Option]) -> tuple[str, str, int | None] | None:
    """The first placeholder in a value a rule judges (a size, a count, a cache mode, a model): (placeholder,
    where, None: the line is the text's to tell); ``None`` when every placeholder names something."""
    for opt in options:
        if opt.name in _NAMING_OPTIONS:
            continue
        if not opt.props:
            found = placeholders(opt.value)
            if found:
                return found[0], opt.label, None
            continue
        for key, value in opt.props.items():
            found = placeholders(str(value)) if key not in _NAMING_KEYS and not isinstance(value, dict) else []
            if found:
                return found[0], f"{opt.label} {key}=", None
    return None


# what a finding about a value QEMU chose by default cites: the option left out, never a domain XPath
_ABSENT_EVIDENCE = {
    "machine": "(no -machine option: QEMU's default machine)",
    "vcpus": "(no -smp option: 1 vCPU)",
    "memory": "(no -m option: QEMU's default size)",
}


_RAM_DEVICES = ("pc-dimm", "virtio-mem-pci", "virtio-mem-ccw", "virtio-mem-device")
_DEVICE_MEMORY = ("nvdimm", "virtio-pmem-pci")


def _memory_devices_kib(devices: list[Option], objects: dict[str, Option]) -> tuple[int, int]:
    """(hotplugged RAM, device memory) of the memory devices, in KiB."""
    ram = device_memory = 0
    for dev in devices:
        drv = str(dev.props.get("driver", "")).lower()
        if drv not in _RAM_DEVICES and drv not in _DEVICE_MEMORY:
            continue
        if drv.startswith("virtio-mem"):
            size = dev.props.get("requested-size")  # what is plugged now, not the region's maximum
        else:
            backend = objects.get(str(dev.props.get("memdev", "")))
            size = backend.props.get("size") if backend is not None else None
        kib = qemu_object_kib(size) or 0
        if drv in _DEVICE_MEMORY:
            device_memory += kib
        else:
            ram += kib
    return ram, device_memory


AHCI_CONTROLLERS = frozenset({"ahci", "ich9-ahci"})


def _disk_from_device(
    dev: Option,
    drive_ref: str,
    storage: _Storage,
    controllers: dict[str, tuple[str, Any]],
    guest: Guest,
) -> Disk:
    p = dev.props
    drv = str(p.get("driver", "")).lower()
    bus = machine_bus(BUS_OF_DEVICE[drv], guest.machine)
    if bus == "ide" and controllers.get(str(p.get("bus", "")).split(".")[0], ("",))[0] in AHCI_CONTROLLERS:
        bus = "sata"  # an IDE device on an AHCI controller's port (PVE's sataN, libvirt's sata on i440fx)
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
    write_cache = None if wc == "auto" else qemu_bool(wc)
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
    bus = machine_bus(BUS_OF_DRIVE_IF.get(iface, iface), guest.machine)
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
    nic.type = NIC_TYPE_OF_NETDEV.get(btype or "", btype)
    if btype == "passt" or (btype == "stream" and "passt" in str(bp.get("addr.path", ""))):
        nic.type, nic.backend = "user", "passt"
    if btype == "tap" or btype == "bridge":
        vhost = qemu_bool(bp.get("vhost"))
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
    if qemu_bool(dp.get("failover")):
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


def guest_from_text(text: str, origin: str, default_binary: str | None = None,
                    host: HostRoot | None = None) -> Guest:
    try:
        argv = split_args_text(text)
    except ValueError as exc:
        raise InputError(origin, str(exc)) from None
    guest = guest_from_argv(argv, origin, default_binary, host)
    judged = guest.derived.get("template_judged")
    if judged is not None and judged[2] is None:
        line = next((n for n, text_line in enumerate(text.splitlines(), 1) if judged[0] in text_line), None)
        guest.derived["template_judged"] = (judged[0], judged[1], line)
    return guest
