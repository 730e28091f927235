"""A Proxmox VE VM config -> :class:`Guest`, with PVE's own defaults applied as PVE 8/9 apply them.

Defaults (PVE admin guide, "Qemu/KVM Virtual Machines" > "Hard Disk"; qemu-server ``QemuServer.pm``
``print_drive_commandline_full``, ``drive_uses_cache_direct`` and ``storage_allows_io_uring_default``):

- cache: ``none`` for a disk that states none (O_DIRECT); a CD-ROM gets QEMU's default.
- aio: ``io_uring``, except on LVM / LVM-thin storage (every cache mode), with a cache mode that is not
  O_DIRECT on CIFS or a kernel-mapped RBD (krbd) — there PVE falls back to ``native`` with O_DIRECT and
  ``threads`` without. PVE passes it for librbd too (QEMU's rbd driver does not use it).
- scsihw: ``lsi`` (the LSI 53C895A) when the config names none; the GUI writes ``virtio-scsi-single`` for new VMs.
- balloon: a virtio balloon with free page reporting unless ``balloon: 0``; cpu ``kvm64``; machine ``pc``
  (i440fx); ``kvm: 1``.

A value taken from these defaults says so in its evidence (``(no cache=: PVE's default none)``).
"""

from __future__ import annotations

import re
import shlex

from kvmtune.domain.windows import OsIdentity
from kvmtune.errors import InputError
from kvmtune.model.guest import Disk, Guest, Nic, Rng
from kvmtune.model.values import machine_bus
from kvmtune.proxmox.config import DISK_KEY, NET_KEY, PveConfig, drive_props, pve_bool, split_property_string
from kvmtune.proxmox.storage import Storage, Volume, resolve_volume
from kvmtune.qemu.cmdline import guest_from_argv
from kvmtune.qemuopts import Aio, Cache, DetectZeroes, Discard

SCSI_DRIVER = {"lsi": "lsi", "lsi53c810": "lsi53c810", "megasas": "megasas", "pvscsi": "pvscsi",
               "virtio-scsi-pci": "virtio-scsi-pci", "virtio-scsi-single": "virtio-scsi-pci"}
DEFAULT_SCSIHW = "lsi"
WINDOWS_OSTYPES = frozenset({"wxp", "w2k", "w2k3", "w2k8", "wvista", "win7", "win8", "win10", "win11"})
LINUX_OSTYPES = frozenset({"l24", "l26"})
DISK_ORDER = ("ide", "sata", "scsi", "virtio")
CONFIG = "pve_config"  # Guest.derived key: the PveConfig a guest was read from


STORAGES = "pve_storages"


def config_of(guest: Guest) -> PveConfig | None:
    cfg = guest.derived.get(CONFIG)
    return cfg if isinstance(cfg, PveConfig) else None


def guest_name(cfg: PveConfig) -> str:
    name = cfg.current.get("name")
    return f"pve:{cfg.vmid} ({name})" if name else f"pve:{cfg.vmid}"


def default_aio(volume: Volume, cache_direct: bool) -> str | None:
    """What PVE passes as aio= when the drive states none (``storage_allows_io_uring_default``)."""
    storage = volume.storage
    kind = storage.type if storage else None
    fallback = (kind in ("lvm", "lvmthin") or (kind == "cifs" and not cache_direct)
                or (storage is not None and storage.krbd and not cache_direct))
    if not fallback:
        return "io_uring"
    return "native" if cache_direct else "threads"


def guest_from_config(cfg: PveConfig, storages: dict[str, Storage] | None) -> tuple[Guest, list[str]]:
    """The guest and the notes a reader should see (unresolved storage, snapshots, pending changes)."""
    c = cfg.current
    guest = Guest(name=guest_name(cfg), origin=cfg.path, origin_kind="pve", vcpus=1)
    guest.derived[CONFIG] = cfg  # what the qm set forms of its findings' fixes start from
    guest.derived[STORAGES] = storages  # what the config is read again with, once a fix changed it
    notes: list[str] = []
    _read_machine_cpu_memory(cfg, guest)
    _read_os(cfg, guest)
    scsihw = c.get("scsihw", DEFAULT_SCSIHW)
    keys = sorted((k for k in c if DISK_KEY.match(k)), key=_disk_sort_key)
    for key in keys:
        disk, problem = _disk(cfg, key, scsihw, storages, guest)
        if disk is not None:
            guest.disks.append(disk)
        if problem:
            notes.append(f"{guest.name} disk:{key}: {problem}; its storage findings are not judged")
    template = pve_bool(c.get("template"))
    if template:  # qemu-server's config_to_command: a template starts only for backup, its disks read-only
        for disk in guest.disks:
            _as_template_disk(disk)
        notes.append(f"{guest.name}: a template (template: 1): PVE starts it only for backup, its disks read-only "
                     "(IDE/SATA ones as CD-ROMs) and without NICs; audited as that start, its clones as their own VMs")
    for key in sorted((k for k in c if NET_KEY.match(k)), key=lambda k: int(k[3:])):
        if not template:
            guest.nics.append(_nic(cfg, key, len(guest.nics), guest.machine))
    guest.hostdevs += sum(1 for k in c if k.startswith("hostpci") and k[7:].isdigit())
    for key in sorted(k for k in c if k.startswith("rng") and k[3:].isdigit()):
        props = dict((k or "source", v) for k, v in split_property_string(c[key]))
        guest.rngs.append(Rng("virtio", "random", props.get("source", "/dev/urandom"), cfg.where(key), len(guest.rngs)))
    if pve_bool((split_property_string(c.get("agent", "0")) or [(None, "0")])[0][1]):
        guest.agent_channel = True
        guest.agent_socket = f"/var/run/qemu-server/{cfg.vmid}.qga"
    if "args" in c:
        _merge_args(cfg, guest)
        notes.append(f"{guest.name}: args: read with the QEMU command-line reader")
    if "hookscript" in c:
        notes.append(f"{guest.name}: hookscript {c['hookscript']} runs at its start and stop (not audited)")
    if cfg.snapshots:
        notes.append(f"{guest.name}: {len(cfg.snapshots)} snapshot(s) ({', '.join(cfg.snapshots[:4])}) not audited: "
                     "the current config only")
    if cfg.pending or cfg.pending_delete:
        shown = [f"{k}: {v}" for k, v in cfg.pending.items()] + [f"delete {k}" for k in cfg.pending_delete]
        notes.append(f"{guest.name}: pending until its next start (not audited yet): {'; '.join(shown)}")
    return guest, notes


def _disk_sort_key(key: str) -> tuple[int, int]:
    for n, bus in enumerate(DISK_ORDER):
        if key.startswith(bus):
            return n, int(key[len(bus):])
    return len(DISK_ORDER), 0


def _read_machine_cpu_memory(cfg: PveConfig, guest: Guest) -> None:
    c = cfg.current
    guest.virt_type = "kvm" if c.get("kvm", "1") != "0" else "qemu"
    guest.arch = {"aarch64": "aarch64"}.get(c.get("arch", ""), "x86_64")
    machine = split_property_string(c.get("machine", "pc"))
    # '.pxe' asks qemu-server for the old PXE ROMs: not part of the machine type QEMU gets
    guest.machine = (machine[0][1] if machine and machine[0][0] in (None, "type") else "pc").lower().removesuffix(".pxe")
    cpu = split_property_string(c.get("cpu", "kvm64"))
    model = (cpu[0][1] if cpu and cpu[0][0] in (None, "cputype") else "kvm64").lower()
    guest.cpu_mode = {"host": "host-passthrough", "max": "maximum"}.get(model, "custom")
    guest.cpu_model = None if model in ("host", "max") else model
    sockets, cores = int(c.get("sockets", "1")), int(c.get("cores", "1"))
    guest.vcpus = int(c["vcpus"]) if "vcpus" in c else sockets * cores
    memory = c.get("memory", "512").removeprefix("current=")
    guest.memory_kib = int(memory) * 1024
    balloon = c.get("balloon")
    guest.memballoon = "none" if balloon == "0" else "virtio"
    # qemu-server adds free-page-reporting=on for machine versions from 6.2 on: a VM pinned below has none
    guest.balloon_free_page_reporting = balloon != "0" and _machine_version(guest.machine) >= (6, 2)
    guest.hugepages = "hugepages" in c
    guest.uuid = next((v for k, v in split_property_string(c.get("smbios1", "")) if k == "uuid"), None)
    for attr, key in (("machine", "machine"), ("cpu", "cpu"), ("vcpus", "cores"), ("memory", "memory"),
                      ("memballoon", "balloon"), ("virt_type", "kvm")):
        guest.evidence[attr] = cfg.where(key)


_PINNED_MACHINE = re.compile(r"^pc(?:-i440fx|-q35)?-(\d+)\.(\d+)(?:\+pve\d+)?$")


def _machine_version(machine: str | None) -> tuple[int, int]:
    """The QEMU machine version a PVE ``machine:`` pins (``pc-i440fx-6.1+pve0``); an alias (``pc``, ``q35``) is the
    newest, which qemu-server pins at start."""
    m = _PINNED_MACHINE.match(machine or "")
    return (int(m.group(1)), int(m.group(2))) if m else (99, 0)


def _read_os(cfg: PveConfig, guest: Guest) -> None:
    ostype = cfg.current.get("ostype")
    if ostype in WINDOWS_OSTYPES:
        guest.derived["os_identity"] = OsIdentity("windows", f"its Proxmox VE ostype {ostype}")
    elif ostype in LINUX_OSTYPES:
        guest.derived["os_identity"] = OsIdentity("linux", f"its Proxmox VE ostype {ostype}")
    elif ostype in ("other", "solaris"):
        guest.derived["os_identity"] = OsIdentity("other", f"its Proxmox VE ostype {ostype}")


def _disk(cfg: PveConfig, key: str, scsihw: str, storages: dict[str, Storage] | None,
          guest: Guest) -> tuple[Disk | None, str | None]:
    volume_id, p = drive_props(cfg.current[key])
    where = cfg.where(key)
    if key == "tpmstate0":
        return None, None  # a TPM's state volume (swtpm), not a disk the guest sees
    media = p.get("media", "disk")
    volume = resolve_volume(volume_id, storages, p.get("format"))
    bus = next(b for b in (*DISK_ORDER, "efidisk") if key.startswith(b))
    disk = Disk(target=key, locator=where, source=volume.source, source_type=volume.source_type,
                protocol=volume.protocol, format=p.get("format", volume.format if media != "cdrom" else None))
    if key == "efidisk0":
        disk.device, disk.bus = "firmware", "pflash"
        return disk, volume.problem
    disk.device = "cdrom" if media == "cdrom" else "disk"
    disk.bus = machine_bus(bus, guest.machine)
    disk.readonly = pve_bool(p.get("ro")) or media == "cdrom"
    disk.shareable = pve_bool(p.get("shared"))
    cache = p.get("cache")
    storage_direct = volume.storage is None or volume.storage.cache_direct_default
    cache_direct = cache in ("none", "directsync") if cache else (media != "cdrom" and storage_direct)
    # no cache=: O_DIRECT (none), except a CD-ROM (QEMU's default) and btrfs without nocow (writeback)
    default = "none" if cache_direct else ("writeback" if media != "cdrom" else None)
    disk.cache = disk.take("cache", Cache, cache or default)
    disk.io = disk.take("io", Aio, p.get("aio") or default_aio(volume, cache_direct))
    disk.discard = Discard.UNMAP if p.get("discard") == "on" else None
    dz = p.get("detect_zeroes")
    disk.detect_zeroes = DetectZeroes.OFF if dz is not None and not pve_bool(dz) else (
        DetectZeroes.UNMAP if disk.discard else DetectZeroes.ON)
    iothread = pve_bool(p.get("iothread"))
    if bus == "virtio" and iothread:
        disk.iothread = f"iothread-{key}"
        guest.iothreads += 1
    if bus == "scsi":
        index = int(key[4:])
        single = scsihw == "virtio-scsi-single"
        disk.scsi_controller = f"virtioscsi{index}" if single else f"scsihw{index // (7 if scsihw.startswith('lsi') else 256)}"
        disk.scsi_controller_model = SCSI_DRIVER[scsihw]
        if single and iothread:
            disk.scsi_controller_iothread = f"iothread-virtioscsi{index}"
            guest.iothreads += 1
        disk.evidence["controller"] = cfg.where("scsihw")
    for attr, prop, shown in (("cache", "cache", disk.cache), ("io", "aio", disk.io)):
        disk.evidence[attr] = where if prop in p else f"{where} (no {prop}=: PVE's default {shown or 'QEMU default'})"
    for attr in ("discard", "iothread", "format", "source", "bus"):
        disk.evidence[attr] = where
    return disk, volume.problem


def _as_template_disk(disk: Disk) -> None:
    """A template's disk as qemu-server's backup start opens it: read-only, and on IDE/SATA an ``ide-cd`` (IDE and
    SATA disks cannot be read-only; ``DriveDevice.pm``)."""
    if disk.device == "firmware":
        return
    disk.readonly = True
    disk.evidence["readonly"] = f"{disk.locator} (template: 1)"
    if disk.bus in ("ide", "sata") and disk.device == "disk":
        disk.device = "cdrom"
        disk.evidence["device"] = f"{disk.locator} (template: 1: PVE attaches it as ide-cd)"


def _nic(cfg: PveConfig, key: str, index: int, machine: str | None) -> Nic:
    items = split_property_string(cfg.current[key])
    props = {k: v for k, v in items if k is not None}
    model, mac = props.get("model"), props.get("macaddr")
    if items and items[0][0] is None:
        model = items[0][1]
    elif items and items[0][0] not in ("model", "bridge", "macaddr"):
        model, mac = items[0][0], items[0][1]  # virtio=BC:24:11:…
    model = (model or "virtio").lower()
    where = cfg.where(key)
    nic = Nic(index=index, model=model, locator=where, mac=mac.lower() if mac else None)
    bridge = props.get("bridge")
    if bridge:
        nic.type, nic.source = "ethernet", bridge  # a tap PVE plugs into the bridge (tap<vmid>i<n>)
        nic.vhost = model == "virtio"  # qemu-server: vhost=on for virtio NICs when vhost_net is there
        nic.driver_name = "vhost" if nic.vhost else "qemu"
    else:
        nic.type = "user"  # no bridge: QEMU's user-mode network (SLIRP)
    if props.get("queues", "").isdigit():
        nic.queues = int(props["queues"])
    if props.get("mtu", "").isdigit() and props["mtu"] != "1":
        nic.mtu = int(props["mtu"])
    nic.evidence = {k: where for k in ("model", "driver_name", "type", "mac", "queues", "mtu")}
    if model == "virtio" and _machine_version(machine) >= (7, 1):  # qemu-server's print_netdevice_full
        nic.rx_queue_size, nic.tx_queue_size = 1024, 256
        for attr in ("rx_queue_size", "tx_queue_size"):
            nic.evidence[attr] = f"{where} (PVE sets {attr}={getattr(nic, attr)} from machine version 7.1 on)"
    return nic


def _merge_args(cfg: PveConfig, guest: Guest) -> None:
    """``args:``: raw QEMU options PVE appends to its command line; read with the command-line reader."""
    try:
        words = shlex.split(cfg.current["args"])
        extra = guest_from_argv(["/usr/bin/kvm", *words], f"{cfg.path} args:")
    except (ValueError, InputError) as exc:
        raise InputError(cfg.path, f"args: {exc}", cfg.lines.get("args")) from None
    where = cfg.where("args")
    for disk in extra.disks:
        if disk.device != "firmware":
            disk.locator = f"{where}: {disk.locator}"
            guest.disks.append(disk)
    for nic in extra.nics:
        nic.index = len(guest.nics)
        nic.locator = f"{where}: {nic.locator}"
        guest.nics.append(nic)
    guest.rngs.extend(extra.rngs)
    guest.hostdevs += extra.hostdevs
    guest.iothreads += extra.iothreads
    guest.memory_locked = guest.memory_locked or extra.memory_locked
    guest.hugepages = guest.hugepages or extra.hugepages
    if any(w in ("-cpu",) for w in words):
        guest.cpu_mode, guest.cpu_model = extra.cpu_mode, extra.cpu_model
        guest.evidence["cpu"] = where
