"""What a rule may look at besides its target: the audited host's facts and every image of the run.

Everything here is typed: the host as :class:`~kvmtune.host.facts.HostFacts` (read
lazily, once per run), the run's disk images as :class:`~kvmtune.qemu.image.DiskImage`.
The readers below (``host/``, ``qemu/``) know nothing of the auditor; this module
joins them for the rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kvmtune.audit.finding import Target
from kvmtune.audit.thresholds import Thresholds
from kvmtune.host.root import HostRoot
from kvmtune.runner import Runner, default_runner

if TYPE_CHECKING:  # every rule module imports this one (`kvmtune rules list` too): the readers come when used
    from kvmtune.host.facts import HostFacts
    from kvmtune.host.probe import AccelVerdict
    from kvmtune.qemu.image import DiskImage


@dataclass
class AuditContext:
    host: HostRoot = field(default_factory=HostRoot)
    runner: Runner = field(default_factory=default_runner)
    host_name: str = field(default_factory=lambda: _host_name())
    errors: list[str] = field(default_factory=list)
    # every image of this run, for rules that add up across images (set by the engine before the rules run)
    images: list[DiskImage] = field(default_factory=list)
    host_facts: HostFacts | None = None  # given (capture-host records its reads) or read on first use
    # what `kvmtune guest accel` last found on this machine (the CLI reads bench/'s cache and passes it in)
    accel_verdict: AccelVerdict | None = None
    # the thresholds sites disagree on (settings file [thresholds]; defaults cited in audit/settings.py)
    thresholds: Thresholds = field(default_factory=Thresholds)

    @property
    def facts(self) -> HostFacts:
        """The :class:`HostFacts` of the audited host, shared by every rule of one run."""
        if self.host_facts is None:
            from kvmtune.host.facts import HostFacts
            from kvmtune.qemu.process import running_qemu_guests

            self.host_facts = HostFacts(self.host, errors=self.errors, guests=running_qemu_guests,
                                        accel_verdict=self.accel_verdict)
        return self.host_facts

    def host_cpu_count(self) -> int | None:
        """Online CPUs of the host being audited, or ``None`` if unreadable."""
        return self.facts.cpu_count

    def host_label(self) -> str:
        """How findings name the host: its hostname, or the captured tree's directory name."""
        if self.host.is_live:
            return self.host_name
        return Path(self.host.path).resolve().name or self.host.path

    def host_target(self, device: str | None = None) -> Target:
        return Target(host=self.host_label(), device=device)


def _host_name() -> str:
    import socket  # here, not at import: `kvmtune rules list` imports this module and builds no context

    return socket.gethostname()
