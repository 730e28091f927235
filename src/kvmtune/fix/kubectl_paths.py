"""What a journal's ``kubectl`` entry may patch: the spec fields kvmtune's KubeVirt forms set (``rule.kubevirt``), as a
``qm`` entry may only put back the keys kvmtune's PVE forms set. ``fix/journal.py`` refuses a journal whose patch or
reverse holds anything else before anything is sent (``undo`` sends the reverse as it is)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kvmtune.audit.rule import all_rules
from kvmtune.kubevirt.edit import Part, get_in

ANY_ITEM = "[]"


def _segments(field_path: str) -> list[str]:
    """``domain.devices.disks[{disk}].disk.bus`` as ``domain devices disks [] disk bus``."""
    out: list[str] = []
    for part in field_path.split("."):
        name, bracket, _ = part.partition("[")
        out.append(name)
        if bracket:
            out.append(ANY_ITEM)
    return out


def settable_paths(obj_kind: str) -> list[list[str]]:
    """The spec paths (below ``spec``) kvmtune's KubeVirt forms set in an object of ``obj_kind``."""
    out: list[list[str]] = []
    for rule in all_rules():
        form = rule.kubevirt
        if form is None or form.field is None or not form.settable:
            continue
        if obj_kind == "VirtualMachine":
            segs = ["template", "spec", *_segments(form.field)]
            out.append(segs)
            if segs[-2:] == ["disk", "bus"]:  # a lun's or cdrom's bus is under its own key (want_for)
                out.extend([*segs[:-2], device, "bus"] for device in ("lun", "cdrom"))
        elif "Instancetype" in obj_kind and form.instancetype:
            out.append(_segments(form.instancetype))
        elif "Preference" in obj_kind and form.preference:
            out.append(_segments(form.preference))
    return out


def _leaves(value: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            yield from _leaves(v, [*path, str(k)])
    else:
        yield path, value


def _without(item: Any, sub: list[str]) -> Any:
    """``item`` less the value at ``sub`` (what kvmtune may change in one list item)."""
    if not sub or not isinstance(item, dict):
        return item
    out = dict(item)
    if len(sub) == 1:
        out.pop(sub[0], None)
    elif sub[0] in out:
        out[sub[0]] = _without(out[sub[0]], sub[1:])
    return out


def patch_refusals(obj_kind: str, patch: dict[str, Any], reverse: dict[str, Any]) -> list[str]:
    """Why a journal's ``kubectl`` entry patches more than kvmtune sets: a value outside the forms' paths (a volume,
    ``runStrategy``, a node selector), or a list (merge patches replace them whole) whose items differ from the other
    side's in more than those paths (another disk, another volume name). Empty: only what kvmtune sets."""
    allowed = settable_paths(obj_kind)
    out: list[str] = []
    sides = {"patch": patch.get("spec"), "reverse": reverse.get("spec")}
    for side, spec in sides.items():
        other = sides["reverse" if side == "patch" else "patch"]
        for path, value in _leaves(spec if isinstance(spec, dict) else {}, []):
            shown = ".".join(["spec", *path])
            if any(len(path) >= len(t) and path[:len(t)] == t for t in allowed):
                continue  # the value of a field kvmtune sets, or below it (hyperv's enlightenments)
            subs = [t[len(path) + 1:] for t in allowed if t[:len(path)] == path and t[len(path):len(path) + 1] == [ANY_ITEM]]
            if not subs:
                out.append(f"its {side} sets {shown}, which kvmtune does not set")
                continue
            parts: list[Part] = list(path)
            found, theirs = get_in(other, parts) if isinstance(other, dict) else (False, None)
            if not (isinstance(value, list) and found and isinstance(theirs, list) and len(value) == len(theirs)):
                out.append(f"its {side} replaces the list {shown} with one the other side does not match item for item")
                continue
            mine_items, their_items = list(value), list(theirs)
            for sub in subs:
                mine_items = [_without(i, sub) for i in mine_items]
                their_items = [_without(i, sub) for i in their_items]
            if mine_items != their_items:
                out.append(f"its {side} changes the items of {shown} in more than what kvmtune sets in them")
    return sorted(set(out))
