"""Host rules (KVM-HST-NNN): the hypervisor's kernel tunables, devices and load.

Every rule reads :class:`~kvmtune.host.facts.HostFacts` (never a file), so
the same rule runs against this machine or a captured tree (``--root``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from kvmtune.audit.context import AuditContext
from kvmtune.audit.finding import Finding, Target
from kvmtune.audit.rule import HostRule
from kvmtune.host.facts import HostFacts, host_facts, host_target


class HostFactsRule(HostRule):
    """A host rule that looks at :class:`HostFacts`; a bug in one rule costs one error line, not the audit."""

    def check_host(self, ctx: AuditContext) -> Iterator[Finding]:
        facts = host_facts(ctx)
        try:
            yield from self.check_facts(facts, ctx)
        except Exception as exc:
            ctx.errors.append(f"{self.id}: could not be evaluated ({type(exc).__name__}: {exc})")

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterable[Finding]:
        raise NotImplementedError

    @staticmethod
    def at(ctx: AuditContext, device: str | None = None) -> Target:
        return host_target(ctx, device)


def gib(kib: int | float) -> str:
    return f"{kib / 1024 / 1024:.1f} GiB"


def mib_bytes(b: int | float) -> str:
    return f"{b / 1024 / 1024:.1f} MiB"
