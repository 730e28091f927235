"""Where PVE keeps VM configs, and reading them: a host's ``/etc/pve`` (live or a captured tree) or files named.

``/etc/pve`` is the cluster file system: every node sees every VM's config under
``/etc/pve/nodes/<node>/qemu-server/``, and ``/etc/pve/qemu-server`` is this node's (a link to
``nodes/<this node>/qemu-server``). A VM runs on the node whose directory holds its config, so a node's
audit reads its own configs and names the others' nodes, and each VM is audited once, on its node.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from kvmtune.errors import InputError
from kvmtune.host.root import HostReadError, HostRoot
from kvmtune.inputs import read_regular
from kvmtune.model.guest import Guest
from kvmtune.proxmox.config import VMID_FILE, PveConfig, parse_config
from kvmtune.proxmox.guest import guest_from_config
from kvmtune.proxmox.storage import Storage, default_storages, parse_storage_cfg
from kvmtune.textsafe import safe

MAX_CONFIG_BYTES = 1024 * 1024  # pmxcfs holds files of at most 1 MiB
STORAGE_CFG = "/etc/pve/storage.cfg"


@dataclass
class PveRead:
    guests: list[Guest] = field(default_factory=list)
    configs: list[PveConfig] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def vmid_of(path: str) -> str:
    m = VMID_FILE.match(os.path.basename(path))
    if m is None:
        raise InputError(path, "not a Proxmox VE VM config name (<vmid>.conf, VMID 100 or more)")
    return m.group(1)


def read_config_text(text: str, path: str, storages: dict[str, Storage] | None, node: str | None = None
                     ) -> tuple[Guest, PveConfig, list[str]]:
    cfg = parse_config(text, path, vmid_of(path))
    cfg.node = node
    guest, notes = guest_from_config(cfg, storages)
    notes[:0] = cfg.notes
    if node:
        notes.insert(0, f"{guest.name}: runs on node {node}")
    return guest, cfg, notes


def storage_file(path: str) -> dict[str, Storage]:
    data = read_regular(path, MAX_CONFIG_BYTES)
    return parse_storage_cfg(data.decode("utf-8", "replace"), path)


def host_storages(host: HostRoot) -> dict[str, Storage] | None:
    """The host's storage.cfg; ``None`` when it has none (a storage ID then stays unresolved)."""
    text = host.read_optional(STORAGE_CFG)
    if text is None:
        return None
    return parse_storage_cfg(text, str(host.beneath(STORAGE_CFG)) if not host.is_live else STORAGE_CFG)


def read_files(paths: list[str], storages: dict[str, Storage] | None) -> PveRead:
    """``.conf`` files named on the command line (directories: their ``<vmid>.conf`` files)."""
    out = PveRead()
    files: list[str] = []
    for raw in paths:
        if os.path.isdir(raw):
            found = sorted(str(p) for p in Path(raw).iterdir() if VMID_FILE.match(p.name) and p.is_file())
            if not found:
                out.errors.append(f"{raw}: directory has no <vmid>.conf files")
            files.extend(found)
        else:
            files.append(raw)
    for path in files:
        try:
            text = read_regular(path, MAX_CONFIG_BYTES).decode("utf-8", "replace")
            guest, cfg, notes = read_config_text(text, path, storages if storages is not None else default_storages())
        except InputError as exc:
            out.errors.append(str(exc))
            continue
        out.guests.append(guest)
        out.configs.append(cfg)
        out.notes.extend(notes)
    return out


def local_node(host: HostRoot) -> str | None:
    link = host.readlink("/etc/pve/local")
    if link:
        return link.rstrip("/").rsplit("/", 1)[-1]
    target = host.readlink("/etc/pve/qemu-server")
    if target and "nodes/" in target:
        return target.split("nodes/", 1)[1].split("/", 1)[0]
    name = host.read_optional("/etc/hostname")
    return name.strip().split(".", 1)[0] if name and name.strip() else None


# a PVE node name is a host name's first label (pvecm: letters, digits and '-', not at either end)
NODE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def cluster_nodes(host: HostRoot) -> tuple[list[str], list[str]]:
    """The nodes of the cluster ``/etc/pve/nodes/`` names (directories of a node name's syntax, never a link: pmxcfs
    has none there), and the entries that are not (shown with :func:`kvmtune.textsafe.safe`)."""
    nodes, skipped = [], []
    for name in sorted(host.listdir("/etc/pve/nodes")):
        path = f"/etc/pve/nodes/{name}"
        if NODE_NAME.fullmatch(name) and host.readlink(path) is None and host.is_dir(path):
            nodes.append(name)
        else:
            skipped.append(safe(name))
    return nodes, skipped


def read_host(host: HostRoot) -> PveRead:
    """This node's VM configs in the host's ``/etc/pve``: each VM once, on the node that runs it."""
    out = PveRead()
    if not host.is_dir("/etc/pve"):
        return out
    node = local_node(host)
    storages = host_storages(host)
    if storages is None:
        out.notes.append(f"{STORAGE_CFG}: absent; storage IDs are not resolved")
    here = [f"/etc/pve/qemu-server/{n}" for n in host.listdir("/etc/pve/qemu-server") if VMID_FILE.match(n)]
    if node:
        here += [f"/etc/pve/nodes/{node}/qemu-server/{n}" for n in host.listdir(f"/etc/pve/nodes/{node}/qemu-server")
                 if VMID_FILE.match(n)]
    nodes, skipped = cluster_nodes(host)
    if skipped:
        out.notes.append(f"/etc/pve/nodes: {len(skipped)} entry(ies) not a node (a link, or not a node name): "
                         f"{', '.join(skipped[:4])}; not counted as cluster nodes")
    peers = tuple(n for n in nodes if n != node)
    elsewhere: dict[str, int] = {}
    for other in host.listdir("/etc/pve/nodes"):
        if other != node:
            count = sum(1 for n in host.listdir(f"/etc/pve/nodes/{other}/qemu-server") if VMID_FILE.match(n))
            if count:
                elsewhere[other] = count
    seen: set[str] = set()
    for path in here:
        vmid = vmid_of(path)
        if vmid in seen:
            continue  # qemu-server is nodes/<this node>/qemu-server
        seen.add(vmid)
        shown = path if host.is_live else str(host.beneath(path))
        try:
            text = host.read_text(path, MAX_CONFIG_BYTES)
            guest, cfg, notes = read_config_text(text, shown, storages, node)
        except HostReadError as exc:
            out.errors.append(f"{shown}: {exc.problem}")
            continue
        except InputError as exc:
            out.errors.append(str(exc))
            continue
        cfg.peers = peers
        guest.on_audited_host = True
        guest.images_here = host.is_live
        out.guests.append(guest)
        out.configs.append(cfg)
        out.notes.extend(notes)
    if out.guests or elsewhere:
        others = ", ".join(f"{n} ({c})" for n, c in sorted(elsewhere.items()))
        out.notes.insert(0, f"Proxmox VE node {node or '?'}: {len(out.guests)} VM config(s)"
                         + (f"; those of {others} are audited on their own nodes" if others else ""))
    return out
