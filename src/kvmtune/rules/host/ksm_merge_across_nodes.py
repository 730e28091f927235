from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.rules.host import HostFactsRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


class KsmMergeAcrossNodes(HostFactsRule):
    id = "KVM-HST-007"
    slug = "ksm-merge-across-nodes"
    topic = "ksm"
    severity = Severity.LOW
    title = "KSM merges pages across NUMA nodes"
    why = (
        "With merge_across_nodes=1 a page shared by guests on two nodes lives on one of them, so the others read "
        "it as remote memory; seed 000 names this latency as the reason to keep critical guests out of KSM."
    )
    fix_kind = "manual"
    fix_description = (
        "echo 2 > /sys/kernel/mm/ksm/run (unmerge), echo 0 > merge_across_nodes, echo 1 > run; or exclude "
        "latency-critical guests with <memoryBacking><nosharepages/>."
        " Not automatic: unmerging first needs the memory sharing saved, which only the administrator can judge."
    )
    references = (
        "seed:000 (Controlling KSM per guest: shared pages on another NUMA node are remote memory)",
        "RHEL 7 Virtualization Tuning and Optimization Guide §9.4 (merge_across_nodes=0 on NUMA)",
        "Linux Documentation/admin-guide/mm/ksm.rst: merge_across_nodes",
    )

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        ksm = facts.ksm
        nodes = len(facts.numa_nodes)
        if ksm is None or not ksm.running or nodes < 2 or ksm.merge_across_nodes != 1:
            return
        yield self.finding(
            target=self.at(ctx, "ksm"),
            actual=f"merge_across_nodes=1 on {nodes} NUMA nodes",
            expected="merge_across_nodes=0",
            evidence="/sys/kernel/mm/ksm/merge_across_nodes, /sys/devices/system/node/node*",
        )
