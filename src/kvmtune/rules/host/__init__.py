"""Host rules (KVM-HST-NNN): the hypervisor's kernel tunables, devices and load.

Every rule reads :class:`~kvmtune.host.facts.HostFacts` (never a file), so
the same rule runs against this machine or a captured tree (``--root``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.rule import HostRule

if TYPE_CHECKING:
    from collections.abc import Iterable

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding, Target
    from kvmtune.host.facts import HostFacts


class HostFactsRule(HostRule):
    """A host rule that looks at :class:`HostFacts` (the engine guards the call)."""

    def check_host(self, ctx: AuditContext) -> Iterable[Finding]:
        return self.check_facts(ctx.facts, ctx)

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterable[Finding]:
        raise NotImplementedError

    @staticmethod
    def at(ctx: AuditContext, device: str | None = None) -> Target:
        return ctx.host_target(device)


def gib(kib: int | float) -> str:
    return f"{kib / 1024 / 1024:.1f} GiB"


def mib_bytes(b: int | float) -> str:
    return f"{b / 1024 / 1024:.1f} MiB"
