"""The answer ``kvmtune guest accel`` keeps in the work directory, readable without QEMU.

The benchmark side writes it (:mod:`kvmtune.lab.accel`); the host audit reads it as
evidence that KVM does or does not boot a guest here (KVM-HST-001), which neither
``/dev/kvm`` nor the CPU flags prove.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from kvmtune.host.probe import AccelVerdict
from kvmtune.host.root import HostRoot
from kvmtune.lab.workdir import default_workdir

CACHE_NAME = "accel.json"
CACHE_TTL_S = 24 * 3600


def read_cached_verdict(workdir: Path, osrelease: str, now: float | None = None) -> AccelVerdict | None:
    """The cached verdict if it is for this kernel and younger than a day; else None.

    The cache key is ``probe guest|QEMU version|kernel release``; QEMU is not asked
    here, so only the kernel part is matched (a QEMU upgrade rarely makes KVM work)."""
    path = workdir / CACHE_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        key = str(data["key"])
        age = (time.time() if now is None else now) - float(data["at"])
        choice = data["choice"]
        accel, reason = str(choice["accel"]), str(choice["reason"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not osrelease or key.rsplit("|", 1)[-1] != osrelease or not 0 <= age < CACHE_TTL_S:
        return None
    if accel not in ("kvm", "tcg"):
        return None
    return AccelVerdict(accel, reason, age, path)


def verdict_for(host: HostRoot) -> AccelVerdict | None:
    """The cached verdict for the machine ``host`` is, for :class:`~kvmtune.host.facts.HostFacts`: a live root
    only (the cache in the work directory is this machine's, not a captured tree's)."""
    if not host.is_live:
        return None
    osrelease = (host.read_optional("/proc/sys/kernel/osrelease") or "").strip()
    return read_cached_verdict(default_workdir(), osrelease)
