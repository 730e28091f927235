"""What a rule may look at besides its target: host facts, read lazily and cached."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any

from kvmtune.host.root import HostRoot
from kvmtune.runner import Runner, default_runner


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
        from kvmtune.host.facts import host_facts  # facts builds on this module

        return host_facts(self).cpu_count
