from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.verifyplan import NoExperiment
from kvmtune.host.settings import SWAPPINESS
from kvmtune.rules.host import HostFactsRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


class SwappinessHigh(HostFactsRule):
    id = "KVM-HST-010"
    slug = "swappiness-high"
    topic = "swap"
    severity = Severity.LOW
    title = "vm.swappiness is above what tuned's virtual-host profile sets"
    why = (
        "With the default swappiness of 60 the kernel readily swaps out anonymous memory, which on a KVM host is "
        "mostly guest RAM, to keep file cache; tuned's virtual-host profile (via throughput-performance) sets 10."
    )
    fix_kind = "sysctl"
    fix_description = "vm.swappiness = 10 in /etc/sysctl.d/90-kvmtune.conf (or activate tuned's virtual-host profile)."
    fix_safe = True
    references = (
        "tuned profiles/throughput-performance/tuned.conf: vm.swappiness=10 (included by virtual-host)",
        "seed:000 (Swapping)",
    )
    verify = NoExperiment("swappiness acts only under memory pressure; verify does not push this host into swapping")

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        if not facts.kvm_loaded and not facts.guests:
            return  # not acting as a hypervisor
        value = facts.sysctl_int("vm.swappiness")
        if value is None or value <= SWAPPINESS:
            return
        yield self.finding(
            target=self.at(ctx, "sysctl:vm.swappiness"),
            actual=str(value),
            expected=f"{SWAPPINESS} (tuned virtual-host)",
            evidence=facts.sysctl_evidence("vm.swappiness"),
        )
