"""A running Proxmox VE node's VM configuration as structured data: ``pvesh get /nodes/localhost/qemu/VMID/config
--output-format json``, through the one :class:`~kvmtune.runner.Runner`.

The API answers one JSON object: each config key to its value (a string or a number; ``description`` is the
notes as they are, newlines and all) and ``digest``, the SHA-1 of the config file that ``qm set --digest``
checks, so that a config changed since it was read is refused by PVE itself. Without ``--current 1`` the
pending changes are applied (what the VM gets at its next start). ``qm config`` is not read: it prints the
same values as ``key: value`` lines, which a value can only be told apart from by PVE's own encoding rules.

``localhost`` is the node PVE's API resolves to the one it runs on (``pvesh``'s ``check_proxyto`` never
proxies it), so no host name read from the system reaches the path. What the command prints is hostile:
at most :data:`MAX_JSON_BYTES`, one object, no key twice, keys of PVE's key syntax, each value a string or a
number (never ``true``, ``null``, a list or an object), a 40-digit hex digest; a ``\\n`` in any value but the
description is refused (PVE's config file cannot hold one). Anything else is a :class:`~kvmtune.proxmox.qm.QmError`
naming the VM and the problem in one line; the VM is then not planned.
"""

from __future__ import annotations

import json
import math
import re

from kvmtune.proxmox.qm import MAX_OUTPUT_BYTES, QmConfig, QmError, run_bounded, valid_vmid
from kvmtune.runner import Runner

PVESH = "pvesh"
NODE = "localhost"
# a config file is at most 1 MiB (pmxcfs); JSON writes a control character in six bytes
MAX_JSON_BYTES = MAX_OUTPUT_BYTES  # what run_bounded holds of an answer
MAX_KEYS = 2048
_KEY = re.compile(r"[a-z][a-z0-9_-]{0,63}")
_DIGEST = re.compile(r"[0-9a-f]{40}")


def config_argv(vmid: str, *, current: bool = False) -> list[str]:
    if not valid_vmid(vmid):
        raise QmError(f"{vmid!r} is not a VMID")
    return [PVESH, "get", f"/nodes/{NODE}/qemu/{vmid}/config", *(["--current", "1"] if current else []),
            "--output-format", "json"]


def config(runner: Runner, vmid: str, *, current: bool = False) -> QmConfig:
    """VM ``vmid``'s config, pending changes applied (``current``: without them), with its digest."""
    result = _get(runner, config_argv(vmid, current=current), f"pvesh get /nodes/{NODE}/qemu/{vmid}/config")
    return parse_config_json(result, vmid)


class _Duplicate(ValueError):
    pass


def _pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


def _constant(name: str) -> object:
    raise ValueError(f"{name} is not a number JSON allows")


def _text(value: object) -> str | None:
    """A value as the config file holds it: a string as is, an integer or a finite number in decimal."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return str(int(value)) if value.is_integer() else repr(value)
    return None


def _get(runner: Runner, argv: list[str], where: str) -> str:
    return run_bounded(runner, argv, f"{where}: more than {MAX_JSON_BYTES // (1024 * 1024)} MiB of output")


def _load_json(text: str, where: str, duplicate: str) -> object:
    """``pvesh``'s answer read as hostile JSON: bounded, every object's keys once (``duplicate`` words the refusal,
    ``{!r}`` the key), no NaN or Infinity; anything else is one :class:`QmError` naming ``where``."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_JSON_BYTES:
        raise QmError(f"{where}: more than {MAX_JSON_BYTES // (1024 * 1024)} MiB of output")
    try:
        return json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant)
    except _Duplicate as exc:
        raise QmError(f"{where}: " + duplicate.format(str(exc)[:64])) from None
    except (ValueError, RecursionError) as exc:
        raise QmError(f"{where}: not JSON ({str(exc)[:80]})") from None


def parse_config_json(text: str, vmid: str) -> QmConfig:
    where = f"pvesh get /nodes/{NODE}/qemu/{vmid}/config"
    data = _load_json(text, where, "key {!r} appears twice")
    if not isinstance(data, dict):
        raise QmError(f"{where}: not a JSON object but {type(data).__name__}")
    if len(data) > MAX_KEYS:
        raise QmError(f"{where}: {len(data)} keys, more than a VM config has")
    out = QmConfig()
    for key, value in data.items():
        if not _KEY.fullmatch(key):
            raise QmError(f"{where}: {key[:64]!r} is not a config key")
        as_text = _text(value)
        if as_text is None:
            raise QmError(f"{where}: {key}: a {type(value).__name__}, not a string or a number")
        if key == "digest":
            if not _DIGEST.fullmatch(as_text):
                raise QmError(f"{where}: digest {as_text[:64]!r} is not 40 hex digits")
            out.digest = as_text
            continue
        if key != "description" and ("\n" in as_text or "\0" in as_text):
            raise QmError(f"{where}: {key}: a line break or NUL in a value PVE's config file cannot hold")
        out.values[key] = as_text
    if not out.digest:
        raise QmError(f"{where}: no digest (is this Proxmox VE's API?)")
    return out


def pending_argv(vmid: str) -> list[str]:
    if not valid_vmid(vmid):
        raise QmError(f"{vmid!r} is not a VMID")
    return [PVESH, "get", f"/nodes/{NODE}/qemu/{vmid}/pending", "--output-format", "json"]


def pending(runner: Runner, vmid: str) -> dict[str, str | None]:
    """VM ``vmid``'s changes still waiting for its next start: each key to its pending value (``None``: a pending
    delete). Keys whose value is in force are left out."""
    return parse_pending_json(_get(runner, pending_argv(vmid), f"pvesh get /nodes/{NODE}/qemu/{vmid}/pending"), vmid)


_PENDING_FIELDS = frozenset({"key", "value", "pending", "delete"})


def parse_pending_json(text: str, vmid: str) -> dict[str, str | None]:
    """PVE's ``GET /nodes/NODE/qemu/VMID/pending`` (qemu-server ``API2/Qemu.pm`` ``vm_pending``): a list of
    ``{key, value?, pending?, delete?}``, ``delete`` 1 (pending delete) or 2 (forced). Read as hostile: one list, at
    most :data:`MAX_KEYS` objects of only those fields, each key once and of PVE's key syntax, values strings or
    numbers without a line break (but the description), ``delete`` 0, 1 or 2."""
    where = f"pvesh get /nodes/{NODE}/qemu/{vmid}/pending"
    data = _load_json(text, where, "field {!r} appears twice in one item")
    if not isinstance(data, list):
        raise QmError(f"{where}: not a JSON list but {type(data).__name__}")
    if len(data) > MAX_KEYS:
        raise QmError(f"{where}: {len(data)} items, more than a VM config has")
    out: dict[str, str | None] = {}
    seen: set[str] = set()
    for n, item in enumerate(data, 1):
        key, value = _pending_item(item, n, where)
        if key in seen:
            raise QmError(f"{where}: key {key!r} appears twice")
        seen.add(key)
        if value is not _IN_FORCE:
            out[key] = value if isinstance(value, str) else None
    return out


_IN_FORCE = object()


def _pending_item(item: object, n: int, where: str) -> tuple[str, object]:
    """One item of the pending list: its key and its pending value, None for a pending delete, or _IN_FORCE."""
    if not isinstance(item, dict) or not set(item) <= _PENDING_FIELDS:
        raise QmError(f"{where}: item {n} is not an object of key, value, pending and delete")
    key = item.get("key")
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise QmError(f"{where}: item {n}: {str(key)[:64]!r} is not a config key")
    values: dict[str, str] = {}
    for field_name in ("value", "pending"):
        if field_name in item:
            as_text = _text(item[field_name])
            if as_text is None:
                raise QmError(f"{where}: {key}: {field_name} is a {type(item[field_name]).__name__}, not a "
                              "string or a number")
            if key != "description" and ("\n" in as_text or "\0" in as_text):
                raise QmError(f"{where}: {key}: a line break or NUL in a value PVE's config file cannot hold")
            values[field_name] = as_text
    delete = item.get("delete", 0)
    if isinstance(delete, bool) or delete not in (0, 1, 2):
        raise QmError(f"{where}: {key}: delete is {str(delete)[:20]!r}, not 0, 1 or 2")
    if delete:
        return key, None
    return key, values.get("pending", _IN_FORCE)
