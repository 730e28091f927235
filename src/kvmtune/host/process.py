"""Per-process facts from ``/proc/<pid>/stat``, read through a :class:`HostRoot`, and which binaries are QEMU."""

from __future__ import annotations

import os

from kvmtune.host.parsers import PidStat, parse_pid_stat
from kvmtune.host.root import HostRoot


def is_qemu_binary(path: str) -> bool:
    """qemu-system-*, and RHEL's /usr/libexec/qemu-kvm (RHEL 6-9 run guests with it)."""
    base = path.rsplit("/", 1)[-1]
    return "qemu-system-" in base or base == "qemu-kvm"


def read_pid_stat(host: HostRoot, pid: int | str) -> PidStat | None:
    """The parsed stat of ``pid`` (``"self"`` allowed), or None when it is gone or unreadable."""
    text = host.read_optional(f"/proc/{pid}/stat")
    if not text:
        return None
    try:
        return parse_pid_stat(text)
    except ValueError:
        return None


def process_cpu_s(host: HostRoot, pid: int | str) -> float | None:
    """User plus system CPU seconds of ``pid``; None once it is gone."""
    st = read_pid_stat(host, pid)
    return None if st is None else (st.utime + st.stime) / os.sysconf("SC_CLK_TCK")
