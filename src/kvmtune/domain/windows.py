"""Is a guest running Windows? Domain XML does not say so directly; these are the hints libvirt
tools leave (libosinfo metadata, Hyper-V enlightenments, a local-time clock, the name).

What the guest says of itself wins: its agent's ``guest-get-osinfo`` (``Guest.inside``), then the
libosinfo id virt-install and virt-manager write into ``<metadata>``; the heuristics only speak when
neither names the OS (a Debian guest with its clock in local time is not Windows)."""

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


@dataclass(frozen=True)
class OsIdentity:
    """What a guest's own records say it runs: ``family`` windows | linux | bsd | other, the libosinfo id
    or the agent's kernel release it came from, and ``kernel`` (major, minor) when known."""

    family: str
    reason: str
    kernel: tuple[int, int] | None = None


# libosinfo id prefixes (after http(s)://) -> family; the ids are the project's short-id URLs
_OSINFO_FAMILIES = (
    ("microsoft.com/win", "windows"),
    ("debian.org/", "linux"), ("ubuntu.com/", "linux"), ("redhat.com/rhel", "linux"), ("centos.org/", "linux"),
    ("fedoraproject.org/", "linux"), ("almalinux.org/", "linux"), ("rockylinux.org/", "linux"),
    ("opensuse.org/", "linux"), ("suse.com/", "linux"), ("oracle.com/ol", "linux"), ("archlinux.org/", "linux"),
    ("alpinelinux.org/", "linux"), ("gentoo.org/", "linux"), ("libosinfo.org/linux", "linux"),
    ("coreos.fedoraproject.org/", "linux"), ("nixos.org/", "linux"), ("mageia.org/", "linux"),
    ("freebsd.org/", "bsd"), ("openbsd.org/", "bsd"), ("netbsd.org/", "bsd"), ("dragonflybsd.org/", "bsd"),
)
# the kernel a distribution release ships (its first release; later point releases keep the series)
_OSINFO_KERNELS = {
    "redhat.com/rhel/6": (2, 6), "redhat.com/rhel/7": (3, 10), "centos.org/centos/6": (2, 6),
    "centos.org/centos/7": (3, 10), "debian.org/debian/8": (3, 16), "debian.org/debian/9": (4, 9),
    "debian.org/debian/10": (4, 19), "debian.org/debian/11": (5, 10), "debian.org/debian/12": (6, 1),
    "ubuntu.com/ubuntu/14.04": (3, 13), "ubuntu.com/ubuntu/16.04": (4, 4), "ubuntu.com/ubuntu/18.04": (4, 15),
    "ubuntu.com/ubuntu/20.04": (5, 4), "ubuntu.com/ubuntu/22.04": (5, 15), "ubuntu.com/ubuntu/24.04": (6, 8),
}
_KERNEL = re.compile(r"(\d+)\.(\d+)")


def os_identity(guest: Guest) -> OsIdentity | None:
    """The guest's OS as its agent or its libosinfo metadata states it; ``None``: neither says."""
    inside = guest.inside
    if inside is not None and inside.os_kind is not None:
        m = _KERNEL.match(inside.kernel_release or "")
        kernel = (int(m.group(1)), int(m.group(2))) if m and inside.os_kind == "linux" else None
        release = f", kernel {inside.kernel_release}" if inside.kernel_release else ""
        return OsIdentity(inside.os_kind, f"its guest agent ({inside.os_kind}{release})", kernel)
    if "os_identity" not in guest.derived:
        guest.derived["os_identity"] = _osinfo_identity(guest)
    identity: OsIdentity | None = guest.derived["os_identity"]
    return identity


def _osinfo_identity(guest: Guest) -> OsIdentity | None:
    metadata = _top(guest).get("metadata")
    for os_el in metadata.iter(f"{{{LIBOSINFO_NS}}}os") if metadata is not None else ():
        os_id = (os_el.get("id") or "").strip()
        short = re.sub(r"^https?://", "", os_id).rstrip("/")
        for prefix, family in _OSINFO_FAMILIES:
            if short.startswith(prefix):
                kernel = next((k for rel, k in _OSINFO_KERNELS.items() if short == rel or short.startswith(rel + ".")),
                              None)
                return OsIdentity(family, f"libosinfo os id {os_id}", kernel)
    return None


def windows_hint(guest: Guest) -> WindowsHint | None:
    """Why this guest looks like Windows, or ``None``; worked out once per guest (four rules ask).

    The guest's own identity (agent, libosinfo) decides when there is one; otherwise the heuristics.
    Without agent answers (which come in before the rules run) the answer itself is kept, ~5,000 asks
    per corpus audit costing a dictionary look-up each."""
    if guest.inside is None:
        derived = guest.derived
        if _WINDOWS not in derived:
            derived[_WINDOWS] = _windows_hint(guest)
        cached: WindowsHint | None = derived[_WINDOWS]
        return cached
    return _windows_hint(guest)


_WINDOWS = "windows"  # Guest.derived: windows_hint's answer for a guest without agent answers


def _windows_hint(guest: Guest) -> WindowsHint | None:
    identity = os_identity(guest)
    if identity is not None:
        return WindowsHint(identity.reason, "certain") if identity.family == "windows" else None
    if "windows_hint" not in guest.derived:
        guest.derived["windows_hint"] = _read_hint(guest)
    hint: WindowsHint | None = guest.derived["windows_hint"]
    return hint


def hyperv_hint(guest: Guest) -> WindowsHint | None:
    """:func:`windows_hint` for the Hyper-V enlightenment and timer rules: they are x86 features, so never
    for a guest of another architecture (an s390x or aarch64 guest), nor for a Proxmox VE guest: for a Windows
    ``ostype`` qemu-server itself sets the hv_* CPU flags, ``-no-hpet`` and ``-rtc driftfix=slew,base=localtime``."""
    return windows_hint(guest) if guest.is_x86 and guest.origin_kind != "pve" else None


def guessed(hint: WindowsHint) -> str | None:
    """The line a finding from a guessed identity carries (``extra['guessed']``): the text report shows it and
    ``kvmtune fix`` applies such a finding only when its rule is named; ``None`` when the identity is not a guess."""
    return f"Windows guessed from {hint.reason}" if hint.confidence == "possible" else None


def _top(guest: Guest) -> dict[str, Any]:
    """<metadata>, <features> and <clock> of the guest (four rules read them): among the <domain>
    children the model was built from, not looked up again."""
    return top_elements(guest)


def _read_hint(guest: Guest) -> WindowsHint | None:
    if guest.tree is None:
        return None
    top = _top(guest)
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
