"""A recording stand-in for Proxmox VE's ``pvesh``: ``get /nodes/NODE/qemu/VMID/config [--current 1]
--output-format json`` and ``get /nodes/NODE/qemu/VMID/pending --output-format json``, answered from the fake
``/etc/pve`` the ``qm`` stand-in (``qm.py``, beside this file) keeps.

It answers as PVE's API does (qemu-server ``API2/Qemu.pm`` ``vm_config``, printed by ``PVE::CLIFormatter`` as
canonical JSON): one object of the config's keys, pending changes applied unless ``--current 1``, the
description as its text (newlines and all, not encoded), the integer-typed options as JSON numbers, and
``digest``, the SHA-1 of the config file that ``qm set --digest`` checks. ``…/pending`` answers as qemu-server's
``vm_pending`` does: a list of ``{key, value, pending, delete}`` for every key of the config and its
``[PENDING]`` section, ``pending`` only where a change waits, ``delete: 1`` for a pending delete. NODE is
``localhost`` (the node pvesh runs on) or ``KVMTUNE_QM_NODE``. ``KVMTUNE_PVESH_ANSWER`` names a file whose bytes
are printed instead, for answers PVE would not give (hostile JSON). Every call is appended to ``KVMTUNE_QM_LOG``
as a JSON list.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from qm import conf_path, config_values, digest, read_conf

# qemu-server's schema types these as integer or boolean: the API prints them as numbers
INTEGER_KEYS = frozenset({"acpi", "autostart", "balloon", "cores", "freeze", "kvm", "localtime", "numa", "onboot",
                          "protection", "reboot", "shares", "sockets", "tablet", "template", "vcpus"})
_PATH = re.compile(r"^/nodes/([^/]+)/qemu/([0-9]+)/(config|pending)/?$")


def _value(key: str, value: str) -> object:
    return int(value) if key in INTEGER_KEYS and value.isdigit() else value


def cmd_get(path: str, args: list[str]) -> int:
    m = _PATH.match(path)
    if m is None:
        print(f"No 'get' handler defined for '{path}'", file=sys.stderr)
        return 1
    node, vmid, what = m.groups()
    if node not in ("localhost", os.environ.get("KVMTUNE_QM_NODE", "pve1")):
        print(f"hostname lookup '{node}' failed - failed to get address info for: {node}", file=sys.stderr)
        return 255
    if args[-2:] != ["--output-format", "json"]:
        print("pvesh stand-in: only --output-format json is modelled", file=sys.stderr)
        return 2
    answer = os.environ.get("KVMTUNE_PVESH_ANSWER")
    if answer:
        sys.stdout.buffer.write(Path(answer).read_bytes())
        return 0
    if what == "pending":
        return _pending(vmid)
    current = args[:-2] in (["--current", "1"], ["--current"])
    if args[:-2] and not current:
        print(f"400 unable to parse option: {' '.join(args[:-2])}", file=sys.stderr)
        return 255
    values = config_values(vmid, current=current)
    if values is None:
        print(f"Configuration file 'nodes/pve1/qemu-server/{vmid}.conf' does not exist", file=sys.stderr)
        return 2
    data: dict[str, object] = {k: _value(k, v) for k, v in values.items()}
    data["digest"] = digest(conf_path(vmid))
    sys.stdout.write(json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n")
    return 0


def _pending(vmid: str) -> int:
    path = conf_path(vmid)
    if not path.exists():
        print(f"Configuration file 'nodes/pve1/qemu-server/{vmid}.conf' does not exist", file=sys.stderr)
        return 2
    _description, current, pending, delete, _rest = read_conf(path)
    items: list[dict[str, object]] = []
    for key in sorted({*current, *pending, *delete}):
        item: dict[str, object] = {"key": key}
        if key in current:
            item["value"] = _value(key, current[key])
        if key in pending:
            item["pending"] = _value(key, pending[key])
        if key in delete:
            item["delete"] = 1
        items.append(item)
    sys.stdout.write(json.dumps(items, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n")
    return 0


def main(argv: list[str]) -> int:
    log = os.environ.get("KVMTUNE_QM_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps(["pvesh", *argv]) + "\n")
    if argv[:1] == ["get"] and len(argv) >= 2:
        return cmd_get(argv[1], argv[2:])
    print(f"pvesh stand-in: not modelled: {' '.join(argv)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
