"""Is a guest running Windows? Domain XML does not say so directly; these are the hints libvirt
tools leave (libosinfo metadata, Hyper-V enlightenments, a local-time clock, the name)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kvmtune.model.guest import Guest

LIBOSINFO_NS = "http://libosinfo.org/xmlns/libvirt/domain/1.0"
_WINDOWS_NAME = re.compile(r"(^|[^a-z])(win(dows)?|w2k\d*|ws20\d\d)([^a-z]|$)", re.I)

# the enlightenments libvirt's formatdomain lists for Windows guests (state='on'), as virt-manager sets them
WANTED_HYPERV = ("relaxed", "vapic", "spinlocks", "vpindex", "runtime", "synic", "stimer", "frequencies",
                 "tlbflush", "ipi", "reset")
SPINLOCK_RETRIES = "8191"  # formatdomain: at least 4095; virt-manager and libosinfo use 8191


@dataclass(frozen=True)
class WindowsHint:
    reason: str
    confidence: str  # certain | likely | possible


def _root(guest: Guest) -> Any:
    tree: Any = guest.tree
    if tree is None:
        return None
    return tree.getroot() if hasattr(tree, "getroot") else tree


def windows_hint(guest: Guest) -> WindowsHint | None:
    """Read once per guest: every Windows rule asks, over every guest of a run (root.iter walks the tree)."""
    if "windows_hint" not in guest.derived:
        guest.derived["windows_hint"] = _read_hint(guest)
    hint: WindowsHint | None = guest.derived["windows_hint"]
    return hint


def _read_hint(guest: Guest) -> WindowsHint | None:
    root = _root(guest)
    if root is None:
        return None
    for os_el in root.iter(f"{{{LIBOSINFO_NS}}}os"):
        if "microsoft.com/win" in (os_el.get("id") or ""):
            return WindowsHint(f"libosinfo os id {os_el.get('id')}", "certain")
    if root.find("features/hyperv") is not None:
        return WindowsHint("Hyper-V enlightenments in <features>", "likely")
    if root.find("clock[@offset='localtime']/timer[@name='hypervclock']") is not None:
        return WindowsHint("local-time clock with hypervclock", "likely")
    if _WINDOWS_NAME.search(guest.name):
        return WindowsHint(f"the name {guest.name!r}", "possible")
    clock = root.find("clock")
    if clock is not None and clock.get("offset") == "localtime":
        return WindowsHint("clock offset='localtime'", "possible")
    return None


def hyperv(guest: Guest) -> Any:
    root = _root(guest)
    return root.find("features/hyperv") if root is not None else None


def missing_enlightenments(guest: Guest) -> list[str]:
    """The wanted enlightenments not switched on; none when mode='passthrough' gives the host's all."""
    el = hyperv(guest)
    if el is not None and el.get("mode") in ("passthrough", "host-model"):
        return []
    out = []
    for name in WANTED_HYPERV:
        feat = el.find(name) if el is not None else None
        if feat is None or feat.get("state") != "on":
            out.append(name)
    return out


def timer(guest: Guest, name: str) -> Any:
    root = _root(guest)
    return root.find(f"clock/timer[@name='{name}']") if root is not None else None
