"""Which kernel the guest tier's probe guests boot, and what to say when it lacks a side's driver.

``kvmtune bench`` boots the host's newest ``/boot/vmlinuz-*``. On a hypervisor that is often Debian's
cloud kernel, which has no driver for the emulated hardware the guest-visible fixes move away from
(e1000, e1000e, rtl8139, AHCI), so side A of such a fix could not be booted with it.
``scripts/guest-kernel.sh`` unpacks a generic Debian kernel into :func:`cache_dir` (never into
``/boot``); verify's guest tier boots that one when it is there, ``--guest-kernel PATH``
(``--guest-modules DIR``) when given, else what bench uses.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "KVMTUNE_GUEST_KERNEL_CACHE"
DEFAULT_CACHE = Path("/var/cache/kvmtune/guest-kernel")
FETCH_SCRIPT = "scripts/guest-kernel.sh"
GIVEN = "--guest-kernel"
CACHED = f"the generic kernel {FETCH_SCRIPT} unpacked"
BOOT = "/boot's newest kernel (what bench uses)"


def cache_dir() -> Path:
    """Where ``scripts/guest-kernel.sh`` unpacks kernels (``$KVMTUNE_GUEST_KERNEL_CACHE`` or the default)."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


@dataclass(frozen=True)
class KernelChoice:
    """``kernel``/``modules_dir``: what :class:`kvmtune.lab.guest.GuestBuilder` is given (None: its default,
    /boot's newest and its /lib/modules tree); ``origin``: which of the three it is, for notes and messages."""

    kernel: str | None
    modules_dir: str | None
    origin: str


def _version_key(release: str) -> list[int | str]:
    return [int(p) if p.isdigit() else p for p in re.split(r"[.\-+]", release)]


def cached_kernel(cache: Path | None = None) -> KernelChoice | None:
    """The newest complete release below the cache (``R/boot/vmlinuz-R`` and ``R/lib/modules/R/modules.dep``)."""
    base = cache or cache_dir()
    try:
        releases = [d.name for d in base.iterdir() if d.is_dir() and not d.name.startswith(".")]
    except OSError:
        return None
    for release in sorted(releases, key=_version_key, reverse=True):
        kernel = base / release / "boot" / f"vmlinuz-{release}"
        modules = base / release / "lib" / "modules" / release
        if kernel.is_file() and (modules / "modules.dep").is_file():
            return KernelChoice(str(kernel), str(modules), CACHED)
    return None


def choose_kernel(kernel: str | None = None, modules_dir: str | None = None, cache: Path | None = None) -> KernelChoice:
    """``--guest-kernel``/``--guest-modules`` when given, else the cached generic kernel, else bench's default."""
    if kernel is not None or modules_dir is not None:
        return KernelChoice(kernel, modules_dir, GIVEN)
    return cached_kernel(cache) or KernelChoice(None, None, BOOT)


def choice_for(kernel: str | None, modules_dir: str | None, cache: Path | None = None) -> KernelChoice:
    """Where the kernel verify decided on came from (``kernel``/``modules_dir``: what the CLI put on the context, from
    :func:`choose_kernel`): none is bench's default, the cached kernel's paths are the cached one, anything else given."""
    if kernel is None and modules_dir is None:
        return KernelChoice(None, None, BOOT)
    cached = cached_kernel(cache)
    if cached is not None and (kernel, modules_dir) == (cached.kernel, cached.modules_dir):
        return cached
    return KernelChoice(kernel, modules_dir, GIVEN)


def how_to_get(choice: KernelChoice) -> str:
    """How to get a kernel that has the drivers this one lacks (the end of a "lacks the driver" line)."""
    if choice.origin == BOOT:
        return (f"run {FETCH_SCRIPT} (a generic Debian kernel into {cache_dir()}, /boot untouched) or pass "
                f"{GIVEN} PATH --guest-modules DIR")
    return f"pass {GIVEN} PATH --guest-modules DIR with a kernel that has it (a generic distribution kernel)"


def lacks_line(what: str, drivers: list[str], release: str, choice: KernelChoice) -> str:
    """One line: the side's device, the guest drivers the chosen kernel lacks, and how to get them."""
    return (f"{what} needs the guest driver {', '.join(drivers)}, which the probe guest's kernel {release} "
            f"({choice.origin}) lacks: {how_to_get(choice)}")
