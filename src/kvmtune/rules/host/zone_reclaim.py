from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.verifyplan import HostFixExperiment
from kvmtune.rules.host import HostFactsRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


class ZoneReclaim(HostFactsRule):
    id = "KVM-HST-043"
    slug = "zone-reclaim-mode-on"
    topic = "numa"
    severity = Severity.MEDIUM
    title = "vm.zone_reclaim_mode makes the host reclaim before using another NUMA node"
    why = (
        "With zone reclaim on, an allocation that does not fit the local node first drops page cache (or writes "
        "out or swaps pages) on that node rather than take memory from the next one: guests stall in reclaim "
        "while free memory sits on the other node. The kernel turned it off by default in 3.16 for that reason."
    )
    fix_kind = "sysctl"
    fix_description = "vm.zone_reclaim_mode = 0 in /etc/sysctl.d/90-kvmtune.conf."
    fix_safe = True
    references = (
        "Linux commit 4f9b16a64753 'mm: disable zone_reclaim_mode by default' (3.16)",
        "Documentation/admin-guide/sysctl/vm.rst: zone_reclaim_mode",
        "RHEL 9 Optimizing virtual machine performance: NUMA (memory locality vs reclaim)",
    )
    verify = HostFixExperiment()

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        if not facts.kvm_loaded and not facts.guests:
            return
        value = facts.sysctl_int("vm.zone_reclaim_mode")
        if not value:
            return
        yield self.finding(
            target=self.at(ctx, "sysctl:vm.zone_reclaim_mode"),
            actual=str(value),
            expected="0 (the kernel default since 3.16)",
            evidence=facts.sysctl_evidence("vm.zone_reclaim_mode"),
        )
