"""Is a guest running Windows? Domain XML does not say so directly; these are the hints libvirt
tools leave (libosinfo metadata, Hyper-V enlightenments, a local-time clock, the name)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kvmtune.domain.cputune import kids
from kvmtune.domain.xml import top_elements
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


def windows_hint(guest: Guest) -> WindowsHint | None:
    """Why this guest looks like Windows, or ``None``; worked out once per guest (four rules ask)."""
    if "windows_hint" not in guest.derived:
        guest.derived["windows_hint"] = _read_hint(guest)
    hint: WindowsHint | None = guest.derived["windows_hint"]
    return hint


def _top(guest: Guest) -> dict[str, Any]:
    """<metadata>, <features> and <clock> of the guest (four rules read them): among the <domain>
    children the model was built from, not looked up again."""
    return top_elements(guest)


def _read_hint(guest: Guest) -> WindowsHint | None:
    if guest.tree is None:
        return None
    top = _top(guest)
    metadata = top.get("metadata")
    for os_el in metadata.iter(f"{{{LIBOSINFO_NS}}}os") if metadata is not None else ():
        if "microsoft.com/win" in (os_el.get("id") or ""):
            return WindowsHint(f"libosinfo os id {os_el.get('id')}", "certain")
    features = top.get("features")
    if features is not None and "hyperv" in kids(features, "hyperv"):
        return WindowsHint("Hyper-V enlightenments in <features>", "likely")
    clock = top.get("clock")
    localtime = clock is not None and clock.get("offset") == "localtime"
    if localtime and clock is not None and any(t.get("name") == "hypervclock" for t in clock):
        return WindowsHint("local-time clock with hypervclock", "likely")
    if _WINDOWS_NAME.search(guest.name):
        return WindowsHint(f"the name {guest.name!r}", "possible")
    if localtime:
        return WindowsHint("clock offset='localtime'", "possible")
    return None


def hyperv(guest: Guest) -> Any:
    features = _top(guest).get("features")
    return kids(features, "hyperv").get("hyperv") if features is not None else None


def missing_enlightenments(guest: Guest) -> list[str]:
    """The wanted enlightenments not switched on; none when mode='passthrough' gives the host's all."""
    el = hyperv(guest)
    if el is not None and el.get("mode") in ("passthrough", "host-model"):
        return []
    have = kids(el, *WANTED_HYPERV) if el is not None else {}
    return [name for name in WANTED_HYPERV if name not in have or have[name].get("state") != "on"]


def timer(guest: Guest, name: str) -> Any:
    clock = _top(guest).get("clock")
    for t in clock.iterchildren("timer") if clock is not None else ():
        if t.get("name") == name:
            return t
    return None


# libosinfo ids of Linux distributions (http://<site>/<path>/<version>): the site and the first path part; a
# site alone where all its systems are Linux. Other ids (microsoft.com, freebsd.org, oracle.com/solaris, ...)
# and unknown ones say nothing.
_LINUX_OSINFO = re.compile(
    r"^https?://(?:(?:debian\.org|ubuntu\.com|fedoraproject\.org|centos\.org|opensuse\.org|suse\.com|"
    r"archlinux\.org|almalinux\.org|rockylinux\.org|gentoo\.org|alpinelinux\.org|mageia\.org|mandriva\.com|"
    r"slackware\.com|nixos\.org|linuxmint\.com|manjaro\.org|voidlinux\.org|altlinux\.org|cirros-cloud\.net|"
    r"clearlinux\.org|kali\.org|openeuler\.org|eurolinux\.com|endlessos\.com|elementary\.io)/|"
    r"redhat\.com/(?:rhel|rhel-atomic|rhl|rhcos)/|oracle\.com/ol/|libosinfo\.org/linux/)",
    re.I,
)


def linux_hint(guest: Guest) -> WindowsHint | None:
    """Why this guest is known to run Linux, or ``None``: its libosinfo id names a Linux distribution, or
    its guest agent said so. Never guessed from the absence of Windows hints."""
    if guest.inside is not None and guest.inside.is_linux:
        return WindowsHint(f"the guest agent ({guest.inside.via})", "certain")
    if guest.libosinfo_id and _LINUX_OSINFO.match(guest.libosinfo_id):
        return WindowsHint(f"libosinfo os id {guest.libosinfo_id}", "certain")
    return None
