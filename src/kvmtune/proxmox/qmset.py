"""A rule's fix in Proxmox VE's terms: the ``qm set`` options (and the web UI field) that make it.

Each rule whose fix is a config change declares its PVE form (``pve = PveForm(...)``, plain data) beside its
libvirt form (its text and XML fixer), so there is one source of the advice per rule and one form per kind of
target; this module only interprets the forms. A form turns
one finding's device into :class:`QmChange`: new values for config keys (a drive's or NIC's property
string rewritten, or a VM option such as ``scsihw``). :func:`apply_to_text` writes the merged changes into
the config file's current section the way PVE prints it (the volume or ``model=MAC`` first, the other
properties sorted), leaving every other line, the ``[PENDING]`` section and the snapshots byte for byte.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

from kvmtune.proxmox.config import (
    ASCII_SPACE,
    DISK_KEY,
    NET_KEY,
    PveConfig,
    drive_props,
    format_property_string,
    pve_lines,
    split_property_string,
)
from kvmtune.qemuopts import keyval


@dataclass
class QmChange:
    """New values for config keys (``None``: delete the key) and what a person would click instead."""

    values: dict[str, str | None] = field(default_factory=dict)
    props: dict[str, dict[str, str]] = field(default_factory=dict)  # key -> properties to set in its string
    ui: str = ""
    guest_visible: bool = False  # the guest sees other hardware (controller, NIC model): --allow-bus-change
    cpu_change: bool = False  # the guest's CPU model changes: --allow-cpu-change
    moves: dict[str, str] = field(default_factory=dict)  # a drive re-attached under another key: old -> new
    refused: str = ""  # the form applies, but this config cannot take it (why, in one line); nothing to change
    notes: list[str] = field(default_factory=list)  # what the operator must know beside the change

    def merge(self, other: QmChange) -> None:
        self.values.update(other.values)
        for key, props in other.props.items():
            self.props.setdefault(key, {}).update(props)
        self.guest_visible = self.guest_visible or other.guest_visible
        self.cpu_change = self.cpu_change or other.cpu_change
        self.moves.update(other.moves)
        self.notes.extend(n for n in other.notes if n not in self.notes)


@dataclass(frozen=True)
class PveForm:
    """A rule's fix in Proxmox VE's terms, declared on the rule as plain data (``pve = PveForm(...)``) beside its
    libvirt form (``fix_description`` and its XML fixer); :func:`change_for` turns it into one finding's change.

    ``kind`` says how: ``disk-props`` (``values`` set in the finding's drive), ``set`` (VM options: ``values``,
    an empty value deletes the key), or a form that needs the config: ``aio``, ``iothread``, ``scsihw``,
    ``nic-model``, ``queues``, ``bus`` (the drive's volume re-attached on virtio-blk). ``ui`` is the web UI's
    field, ``{}`` standing for the config key."""

    kind: str
    ui: str
    values: tuple[tuple[str, str], ...] = ()
    guest_visible: bool = False  # the guest sees other hardware (controller, NIC model): --allow-bus-change


Form = Callable[[PveForm, PveConfig, str], "QmChange | None"]


def _disk_key(cfg: PveConfig, device: str) -> str | None:
    key = device.removeprefix("disk:")
    return key if key in cfg.current and device.startswith("disk:") else None


def _nic_key(cfg: PveConfig, device: str) -> str | None:
    mac = device.removeprefix("net:").lower()
    for key, value in cfg.current.items():
        if NET_KEY.match(key) and mac in value.lower():
            return key
    return None


def _disk_props(form: PveForm, cfg: PveConfig, device: str) -> QmChange | None:
    key = _disk_key(cfg, device)
    return QmChange(props={key: dict(form.values)}, ui=form.ui.format(key)) if key else None


def _set(form: PveForm, cfg: PveConfig, device: str) -> QmChange | None:
    return QmChange(values={k: v or None for k, v in form.values}, ui=form.ui, guest_visible=form.guest_visible)


def _aio(form: PveForm, cfg: PveConfig, device: str) -> QmChange | None:
    key = _disk_key(cfg, device)
    if key is None:
        return None
    volume = split_property_string(cfg.current[key])[0][1]
    qcow = volume.endswith((".qcow2", ".vmdk"))
    return QmChange(props={key: {"aio": "io_uring" if qcow else "native"}}, ui=form.ui.format(key))


def _iothread(form: PveForm, cfg: PveConfig, device: str) -> QmChange | None:
    key = _disk_key(cfg, device)
    if key is None:
        return None
    change = QmChange(props={key: {"iothread": "1"}}, ui=form.ui.format(key))
    if key.startswith("scsi") and cfg.current.get("scsihw") != "virtio-scsi-single":
        change.values["scsihw"] = "virtio-scsi-single"
        change.ui += "; Hardware > SCSI Controller > VirtIO SCSI single"
    return change


def _scsihw(form: PveForm, cfg: PveConfig, device: str) -> QmChange | None:
    """One virtio-scsi controller per disk, each with its IOThread: ``virtio-scsi-single`` and ``iothread=1``."""
    scsihw = cfg.current.get("scsihw", "lsi")
    change = QmChange(ui=form.ui, guest_visible=not scsihw.startswith("virtio-scsi"))
    if scsihw != "virtio-scsi-single":
        change.values["scsihw"] = "virtio-scsi-single"
    controller = device.removeprefix("scsi-controller:")
    for key in cfg.current:
        # virtio-scsi-single names each disk's controller virtioscsi<N>: the finding's own disk only
        if key.startswith("scsi") and key[4:].isdigit() and (scsihw != "virtio-scsi-single"
                                                            or controller == f"virtioscsi{key[4:]}"):
            change.props[key] = {"iothread": "1"}
    return change


def _nic_model(form: PveForm, cfg: PveConfig, device: str) -> QmChange | None:
    key = _nic_key(cfg, device)
    if key is None:
        return None
    items = split_property_string(cfg.current[key])
    mac = next((v for k, v in items if k is not None and ":" in v and k not in ("bridge", "macaddr")), None)
    rest = {k: v for k, v in items[1:] if k is not None}
    value = keyval(("virtio", mac)) if mac else "virtio"
    if rest:
        value += "," + ",".join(f"{k}={rest[k]}" for k in sorted(rest))
    return QmChange(values={key: value}, ui=form.ui.format(key), guest_visible=True)


def _queues(form: PveForm, cfg: PveConfig, device: str) -> QmChange | None:
    key = _nic_key(cfg, device)
    if key is None:
        return None
    vcpus = int(cfg.current.get("vcpus") or int(cfg.current.get("sockets", "1")) * int(cfg.current.get("cores", "1")))
    return QmChange(props={key: {"queues": str(min(vcpus, 8))}}, ui=form.ui.format(key))


# the drive properties a virtio-blk drive does not take (qemu-server Drive.pm: $virtio_fmt is the common drive
# properties, iothread and ro; ide and sata add model, ssd and wwn)
_NOT_ON_VIRTIO_DROPPED = ("ssd",)  # a hint about the medium: virtio-blk has no rotation rate to announce
_NOT_ON_VIRTIO_REFUSED = ("model", "wwn", "product", "vendor", "scsiblock", "queues")  # the guest may name the disk by it
_MAX_VIRTIO = 16


def _bus(form: PveForm, cfg: PveConfig, device: str) -> QmChange | None:
    """An IDE or SATA data disk moved to virtio-blk, keeping its volume (what the web UI does with Detach, then
    Edit on the ``unusedN`` it leaves and Add on the VirtIO Block bus): ``qm set VMID --delete sata0 --virtio1
    VOLUME,… [--boot order=…]``. PVE registers the detached volume as ``unusedN`` and drops that entry again when
    the same call attaches the volume under its new key (qemu-server: ``vmconfig_register_unused_drive``, and
    ``write_config`` removing an ``unusedN`` whose volume is in use); ``--delete`` also removes the old key from
    ``boot: order=``, so the new key takes its place there."""
    key = _disk_key(cfg, device)
    if key is None or not key.startswith(("ide", "sata")):
        return None
    ui = form.ui.format(key)
    volume, props = drive_props(cfg.current[key])
    refused = sorted(p for p in props if p in _NOT_ON_VIRTIO_REFUSED)
    if refused:
        return QmChange(ui=ui, refused=f"{key} sets {', '.join(refused)}, which a virtio-blk drive cannot carry and "
                                          "the guest may name the disk by: move it by hand")
    if key in cfg.pending or key in cfg.pending_delete:
        return QmChange(ui=ui, refused=f"{key} has a pending change: apply it (restart the VM) or revert it first")
    used = {k for k in (*cfg.current, *cfg.pending) if k.startswith("virtio")}
    new = next((f"virtio{n}" for n in range(_MAX_VIRTIO) if f"virtio{n}" not in used), None)
    if new is None:
        return QmChange(ui=ui, refused=f"no free virtio drive key (virtio0 to virtio{_MAX_VIRTIO - 1} are in use)")
    rest = {k: v for k, v in props.items() if k not in _NOT_ON_VIRTIO_DROPPED}
    value = ",".join([volume, *(f"{k}={rest[k]}" for k in sorted(rest))])
    change = QmChange(values={key: None, new: value}, ui=ui, guest_visible=True, moves={key: new})
    dropped = [p for p in _NOT_ON_VIRTIO_DROPPED if p in props]
    if dropped:
        change.notes.append(f"{key}'s {', '.join(dropped)}= has no virtio-blk form and is left out")
    boot = cfg.current.get("boot", "")
    items = split_property_string(boot)
    order = next((v for k, v in items if k == "order"), None)
    if order is not None and key in order.split(";"):
        new_order = ";".join(new if d == key else d for d in order.split(";"))
        change.values["boot"] = format_property_string([(k, new_order if k == "order" else v) for k, v in items])
    elif order is None and cfg.current.get("bootdisk") == key:
        change.values["bootdisk"] = new  # the legacy boot format: the disk it boots from is named by bootdisk
    change.notes.append(f"stop VM {cfg.vmid} first: on a running VM PVE would hot-plug {new} while {key} still "
                        "holds the same volume")
    if cfg.current.get("ostype", "").startswith("w"):
        change.notes.append("Windows needs the virtio-blk driver (viostor, from the virtio-win ISO) installed before "
                            f"{key} moves, or it will not find its disk")
    return change


# the CPU type proposed for a VM without AVX: x86-64-v3 (AVX2: Intel since Haswell, AMD since Zen 1), migratable
CPU_PROPOSED = "x86-64-v3"
# PVE's default CPU type since 8.0 (the web UI's): a baseline chosen for clusters mixing older CPUs
PVE_BASELINE = "x86-64-v2-aes"


def _cpu(form: PveForm, cfg: PveConfig, device: str, host_flags: set[str] | None = None) -> QmChange | None:
    """``cpu:`` set to x86-64-v3 (``host`` where this host's CPUs, ``host_flags``, lack AVX2), its other properties
    (flags=, hidden=) kept; never the value it has."""
    items = split_property_string(cfg.current.get("cpu", ""))
    current = next((v for k, v in items if k in (None, "cputype")), "") if items else ""
    ui = form.ui
    proposed = "host" if host_flags is not None and "avx2" not in host_flags else CPU_PROPOSED
    if current.lower() == proposed:
        return QmChange(ui=ui, refused=f"cpu: is {current} already")
    rest = [(k, v) for k, v in items if k not in (None, "cputype")]
    value = ",".join([proposed, *(f"{k}={v}" for k, v in rest)])
    change = QmChange(values={"cpu": value}, ui=ui, cpu_change=True)
    peers = ", ".join(cfg.peers)
    if proposed == "host":
        change.notes.append("this host's CPUs lack AVX2, so x86-64-v3 would not start: 'host' passes them through, "
                            f"at the cost of live migrating VM {cfg.vmid} only to nodes with the same CPU"
                            + (f" (of this cluster's {peers})" if peers else ""))
    elif peers:
        here = "this node's CPUs have it" if host_flags is not None else "this node's CPUs were not read"
        change.notes.append(f"{CPU_PROPOSED} needs AVX2 (Intel Haswell, AMD Zen 1 and later) on every node VM "
                            f"{cfg.vmid} may migrate to: {here}; those of {peers} are not in /etc/pve (PVE keeps them "
                            "in pmxcfs's key-value store, not in a file): check 'grep -qw avx2 /proc/cpuinfo' there "
                            "first; where one lacks it, 'host' is the alternative, at the cost of live migration "
                            "between nodes with different CPUs")
    else:
        change.notes.append(f"{CPU_PROPOSED} needs AVX2 on every node VM {cfg.vmid} runs or migrates on (Intel "
                            "Haswell, AMD Zen 1 and later); where one lacks it, 'host' is the alternative, at the cost "
                            "of live migration between nodes with different CPUs")
    if current.lower() == PVE_BASELINE:
        change.notes.append(f"the current {current} is PVE's default, an accepted migration baseline for a cluster "
                            "with pre-AVX2 CPUs: keep it there (and waive this finding)")
    return change


KINDS: dict[str, Form] = {
    "disk-props": _disk_props, "set": _set, "aio": _aio, "iothread": _iothread, "scsihw": _scsihw,
    "nic-model": _nic_model, "queues": _queues, "bus": _bus, "cpu": _cpu,
}
CACHE_NONE = PveForm("disk-props", "Hardware > Hard Disk ({}) > Cache: No cache", (("cache", "none"),))


def change_for(form: PveForm | None, cfg: PveConfig, device: str | None,
               host_flags: set[str] | None = None) -> QmChange | None:
    """One finding's change: its rule's PVE form (``None``: the rule has none) applied to the config; ``host_flags``
    (this host's CPU flags, ``None``: unknown) choose the CPU type a ``cpu`` form proposes."""
    if form is None:
        return None
    if form.kind == "cpu":
        return _cpu(form, cfg, device or "", host_flags)
    return KINDS[form.kind](form, cfg, device or "")


def new_values(cfg: PveConfig, change: QmChange) -> dict[str, str | None]:
    """Each changed key's new value (``None``: deleted), property strings in PVE's own order."""
    out: dict[str, str | None] = dict(change.values)
    for old, props in change.props.items():
        key = change.moves.get(old, old)  # another finding's change to a drive this change moves: made on its new key
        base = out.get(key) or cfg.current.get(key)
        if base is None:
            continue
        items = split_property_string(base)
        head, rest = items[0], {k: v for k, v in items[1:] if k is not None}
        rest.update(props)
        first = head[1] if head[0] is None else f"{head[0]}={head[1]}"
        out[key] = ",".join([first, *(f"{k}={rest[k]}" for k in sorted(rest))])
    return out


def host_path_volume(volume: str) -> bool:
    """A drive volume that is no PVE storage volume but a path on the host: a file or a device (``/dev/sdb``,
    ``/dev/disk/by-id/…``), or ``cdrom``, the host's CD-ROM drive."""
    return volume.startswith("/") or volume == "cdrom"


def drive_refusal(cfg: PveConfig, change: QmChange, named: frozenset[str] = frozenset()) -> str:
    """Why ``change`` may not be made (empty: it may). A fix changes options on the drives and NICs the VM already
    has: it never creates a drive or NIC key, never puts another volume under one (a bus change moves a volume the VM
    holds to a free key, keeping it), and leaves a drive on a host path or device alone unless the operator named
    that volume (``fix --pve-volume PATH``)."""
    values = new_values(cfg, change)
    moved_from = {new: old for old, new in change.moves.items()}
    for key, value in values.items():
        disk = bool(DISK_KEY.match(key))
        if not disk and not NET_KEY.match(key):
            continue
        if value is None:
            if key in change.moves and key in cfg.current:
                continue
            return f"{key}: a fix does not remove a drive or NIC"
        had = cfg.current.get(moved_from.get(key, key))
        if had is None:
            return f"{key} is not a drive or NIC VM {cfg.vmid} has: a fix never creates one"
        if not disk:
            continue
        volume = drive_props(value)[0]
        if volume != drive_props(had)[0]:
            return f"{key}: the change would put another volume under it"
        if host_path_volume(volume) and volume not in named:
            return (f"{key} is the host's {volume} (a path or device, not a storage volume): changed only when named "
                    f"(--pve-volume {volume})")
    return ""


def qm_set_line(cfg: PveConfig, change: QmChange) -> str:
    values = new_values(cfg, change)
    args = ["qm", "set", cfg.vmid]
    deleted = [k for k, v in values.items() if v is None]
    for key, value in values.items():
        if value is not None:
            args += [f"--{key}", value]
    if deleted:
        args += ["--delete", ",".join(deleted)]
    return shlex.join(args)


def qm_set_argv(cfg: PveConfig, change: QmChange) -> list[str]:
    return shlex.split(qm_set_line(cfg, change))


def apply_to_text(text: str, cfg: PveConfig, change: QmChange) -> str:
    """The config file after the change: the current section's lines replaced, added (before the first section)
    or removed; every other byte kept."""
    values = new_values(cfg, change)
    lines = [line + "\n" for line in pve_lines(text)]  # PVE's lines: \n only
    if lines and not text.endswith("\n"):
        lines[-1] = lines[-1][:-1]
    out: list[str] = []
    done: set[str] = set()
    in_current = True
    for line in lines:
        stripped = line.strip(ASCII_SPACE + "\n")
        if in_current and stripped.startswith("[") and stripped.endswith("]"):
            in_current = False
            out.extend(_added(values, done, cfg, before_section=True, after=out))
        if in_current and ":" in stripped and not stripped.startswith("#"):
            key = stripped.split(":", 1)[0]
            if key in values:
                done.add(key)
                value = values[key]
                if value is not None:
                    out.append(f"{key}: {value}\n")
                continue
        out.append(line)
    if in_current:
        if out and not out[-1].endswith("\n"):
            out[-1] += "\n"
        out.extend(_added(values, done, cfg, before_section=False, after=out))
    return "".join(out)


def _added(values: dict[str, str | None], done: set[str], cfg: PveConfig, *, before_section: bool,
           after: list[str]) -> list[str]:
    new = [f"{k}: {v}\n" for k, v in sorted(values.items()) if k not in done and v is not None]
    done.update(values)
    if new and before_section and after and not after[-1].strip():
        # keep the blank line that separates the current section from the next one
        blank = after.pop()
        return [*new, blank]
    return new
