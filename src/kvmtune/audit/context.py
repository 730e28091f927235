"""What a rule may look at besides its target: host facts, read lazily and cached."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any

from kvmtune.host.root import HostRoot
from kvmtune.runner import Runner, default_runner


def parse_cpu_list(text: str) -> set[int]:
    """Parse a kernel CPU list such as ``0-3,8,10-11``."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.update(range(int(lo), int(hi) + 1))
        else:
            cpus.add(int(part))
    return cpus


@dataclass
class AuditContext:
    host: HostRoot = field(default_factory=HostRoot)
    runner: Runner = field(default_factory=default_runner)
    host_name: str = field(default_factory=socket.gethostname)
    audit_host: bool = False
    errors: list[str] = field(default_factory=list)
    _cache: dict[str, Any] = field(default_factory=dict)

    def cached(self, key: str, compute: Any) -> Any:
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    def host_cpu_count(self) -> int | None:
        """Online CPUs of the host being audited, or ``None`` if unreadable."""

        def compute() -> int | None:
            text = self.host.read_optional("/sys/devices/system/cpu/online")
            if text:
                try:
                    return len(parse_cpu_list(text))
                except ValueError:
                    pass
            info = self.host.read_optional("/proc/cpuinfo")
            if info:
                n = sum(1 for line in info.splitlines() if line.startswith("processor"))
                return n or None
            return None

        result: int | None = self.cached("host_cpu_count", compute)
        return result
