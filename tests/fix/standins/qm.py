"""A recording stand-in for Proxmox VE's ``qm`` (list, config, set), over a fake ``/etc/pve`` tree.

It reads a config as qemu-server's ``parse_vm_config`` does: lines split on ``\n`` only (a U+2028 or ``\r``
stays inside its value), the ``#`` lines before the first section are the description, each percent-decoded
(``PVE::Tools::decode_text``). ``qm config`` prints what PVE's ``qm config`` prints: the keys sorted, the
description on one line percent-encoded (``PVE::Tools::encode_text``), no ``digest`` (PVE's API has the digest:
``tests/fix/standins/pvesh.py``). ``qm set --digest D`` is refused unless D is the file's SHA-1, as PVE does.

No real PVE (no pmxcfs, no API) is involved: this models what kvmtune relies on, as the PVE admin guide and
``qm(1)`` document it. ``KVMTUNE_QM_TREE`` is the fake ``/etc/pve``; this node is ``KVMTUNE_QM_NODE``
(default pve1); the VMs named in ``KVMTUNE_QM_RUNNING`` (comma-separated VMIDs) run, so ``qm set`` keeps their
changes in ``[PENDING]`` as PVE does for changes it cannot hotplug, and applies a NIC's (``netN``) at once where the
VM's ``hotplug`` (default ``network,disk,usb``) names ``network``, as qemu-server's ``vmconfig_update_net`` re-plugs
it (a stopped VM's detached disk becomes
``unusedN`` and leaves the boot order; re-attaching its volume drops the ``unusedN``); every call is appended to
``KVMTUNE_QM_LOG`` as a JSON list. The config is written back the way PVE writes it (description first,
keys sorted, ``[PENDING]`` with its ``delete:`` line, then the snapshot sections), so bytes differ from a
hand-edited file while values stay.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path

DRIVE = re.compile(r"^(ide|sata|scsi|virtio)[0-9]+$")


def conf_path(vmid: str) -> Path:
    node = os.environ.get("KVMTUNE_QM_NODE", "pve1")
    return Path(os.environ["KVMTUNE_QM_TREE"]) / "nodes" / node / "qemu-server" / f"{vmid}.conf"


def read_conf(path: Path) -> tuple[list[str], dict[str, str], dict[str, str], list[str], str]:
    description: list[str] = []
    current: dict[str, str] = {}
    pending: dict[str, str] = {}
    delete: list[str] = []
    rest = ""
    section = ""
    lines = path.read_text(encoding="utf-8").split("\n")
    for line in (raw + "\n" for raw in (lines[:-1] if lines[-1] == "" else lines)):
        s = line.strip(" \t\r\x0b\x0c\n")
        if s.startswith("[") and s.endswith("]"):
            section = s[1:-1]
        if section and section != "PENDING":
            rest += line
            continue
        if not s or s.startswith("["):
            continue
        if s.startswith("#"):
            description.append(decode_text(s[1:]))
            continue
        key, _, value = s.partition(":")
        value = value.strip(" \t")
        if section == "PENDING" and key == "delete":
            delete = [k for k in value.split(",") if k]
        else:
            (pending if section else current)[key] = value
    return description, current, pending, delete, rest


def decode_text(text: str) -> str:
    data = re.sub(rb"%([0-9a-fA-F]{2})", lambda m: bytes([int(m.group(1), 16)]), text.encode("utf-8"))
    return data.decode("utf-8", "replace")


def encode_text(text: str) -> str:
    """Every byte outside printable ASCII, and ':', as %XX: PVE writes a description line so."""
    return "".join(chr(b) if 0x20 <= b <= 0x7E and b != 0x3A else f"%{b:02X}" for b in text.encode("utf-8"))


def _volume(value: str) -> str:
    return value.split(",", 1)[0].removeprefix("file=")


def _detach(vmid: str, key: str, conf: dict[str, str]) -> None:
    """PVE's vmconfig_register_unused_drive: a detached disk of a PVE storage that this VM owns becomes unusedN."""
    value = conf.pop(key)
    volume = _volume(value)
    if "media=cdrom" in value or ":" not in volume or f"vm-{vmid}-" not in volume:
        return
    n = next(n for n in range(256) if f"unused{n}" not in conf)
    conf[f"unused{n}"] = volume


def _drop_from_boot(key: str, conf: dict[str, str]) -> None:
    """``--delete KEY`` also removes KEY from ``boot: order=`` (qemu-server API2/Qemu.pm, update_vm_api)."""
    boot = conf.get("boot", "")
    if boot.startswith("order="):
        order = [d for d in boot.removeprefix("order=").split(";") if d != key]
        conf["boot"] = "order=" + ";".join(order)


def _write(path: Path, description: list[str], current: dict[str, str], pending: dict[str, str],
           delete: list[str], rest: str) -> None:
    # PVE's write_config drops an unusedN entry whose volume a drive uses again
    used = {_volume(v) for k, v in [*current.items(), *pending.items()] if DRIVE.match(k)}
    for key in [k for k, v in current.items() if k.startswith("unused") and v in used]:
        del current[key]
    text = "".join(f"#{encode_text(d)}\n" for d in description) + "".join(f"{k}: {current[k]}\n" for k in sorted(current))
    if pending or delete:
        text += "\n[PENDING]\n" + "".join(f"{k}: {pending[k]}\n" for k in sorted(pending))
        if delete:
            text += f"delete: {','.join(delete)}\n"
    if rest:
        text += "\n" + rest.lstrip("\n")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def digest(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


def cmd_list() -> int:
    running = set(os.environ.get("KVMTUNE_QM_RUNNING", "").split(","))
    print(f"{'VMID':>10} {'NAME':<20} {'STATUS':<10} {'MEM(MB)':<10} {'BOOTDISK(GB)':>12} PID")
    folder = conf_path("100").parent
    for conf in sorted(folder.glob("*.conf"), key=lambda p: int(p.stem)):
        _, current, *_ = read_conf(conf)
        status = "running" if conf.stem in running else "stopped"
        print(f"{conf.stem:>10} {current.get('name', ''):<20} {status:<10} {current.get('memory', '512'):<10} "
              f"{32.0:>12.2f} {4242 if status == 'running' else 0}")
    return 0


def config_values(vmid: str, *, current: bool) -> dict[str, str] | None:
    """The values PVE's API and ``qm config`` show: pending changes applied unless ``current``; None: no VM."""
    path = conf_path(vmid)
    if not path.exists():
        return None
    description, cur, pending, delete, _ = read_conf(path)
    values = dict(cur)
    if not current:
        values.update(pending)
        for key in delete:
            values.pop(key, None)
    if description:
        values["description"] = "\n".join(description)
    return values


def cmd_config(vmid: str, args: list[str]) -> int:
    values = config_values(vmid, current="--current" in args)
    if values is None:
        print(f"Configuration file 'nodes/pve1/qemu-server/{vmid}.conf' does not exist", file=sys.stderr)
        return 2
    for key in sorted(values):  # PVE/CLI/qm.pm: the description encoded on one line, no digest
        value = encode_text(values[key]) if key == "description" else values[key]
        sys.stdout.write(f"{key}: {value}\n")
    return 0


def _hotplugs(key: str, conf: dict[str, str]) -> bool:
    """A change PVE makes on the running VM: a NIC's, where ``hotplug`` names ``network`` (``1``: the default).
    ``KVMTUNE_QM_HOTPLUG_FAILS=1``: the re-plug fails, and PVE keeps the change pending as qemu-server's
    ``vmconfig_hotplug_pending`` does when a hotplug dies ("hotplug problem")."""
    if os.environ.get("KVMTUNE_QM_HOTPLUG_FAILS") == "1":
        return False
    hotplug = conf.get("hotplug", "network,disk,usb").strip()
    kinds = {"network", "disk", "usb"} if hotplug == "1" else set() if hotplug == "0" else set(hotplug.split(","))
    return re.fullmatch(r"net[0-9]+", key) is not None and "network" in kinds


def cmd_set(vmid: str, args: list[str]) -> int:
    path = conf_path(vmid)
    description, current, pending, delete, rest = read_conf(path)
    running = vmid in os.environ.get("KVMTUNE_QM_RUNNING", "").split(",")
    options: dict[str, str] = {}
    while args:
        opt, value, args = args[0], args[1], args[2:]
        if not opt.startswith("--"):
            print(f"400 unable to parse option: {opt}", file=sys.stderr)
            return 255
        if "\n" in value:
            print(f"400 Parameter verification failed. {opt[2:]}: value does not match the regex pattern",
                  file=sys.stderr)
            return 255
        options[opt[2:]] = value
    if "digest" in options and options.pop("digest") != digest(path):
        print("detected modified configuration - file changed by other user? Try again.", file=sys.stderr)
        return 255
    for key in [k for k in options.pop("revert", "").split(",") if k]:
        pending.pop(key, None)
        delete = [d for d in delete if d != key]
    for key in [k for k in options.pop("delete", "").split(",") if k]:
        if "boot" not in options:
            _drop_from_boot(key, pending if running else current)
        if running:
            pending.pop(key, None)
            delete = [*delete, key] if key in current and key not in delete else delete
        elif DRIVE.match(key) and key in current:
            _detach(vmid, key, current)
        else:
            current.pop(key, None)
    for key, value in options.items():
        if running and current.get(key) != value and not _hotplugs(key, current):
            pending[key] = value
        else:
            current[key] = value
            pending.pop(key, None)
        delete = [d for d in delete if d != key]
    _write(path, description, current, pending, delete, rest)
    return 0


def main(argv: list[str]) -> int:
    log = os.environ.get("KVMTUNE_QM_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps(["qm", *argv]) + "\n")
    if argv[:1] == ["list"]:
        return cmd_list()
    if argv[:1] == ["config"] and len(argv) >= 2:
        return cmd_config(argv[1], argv[2:])
    if argv[:1] == ["set"] and len(argv) >= 2:
        return cmd_set(argv[1], argv[2:])
    print(f"qm stand-in: not modelled: {' '.join(argv)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
