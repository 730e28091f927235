from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.verifyplan import HostFixExperiment
from kvmtune.host.parsers import format_cpu_list
from kvmtune.rules.host import HostFactsRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


class NumaBalancingPinned(HostFactsRule):
    id = "KVM-HST-042"
    slug = "numa-balancing-with-pinned-guests"
    topic = "numa"
    severity = Severity.MEDIUM
    title = "Automatic NUMA balancing runs on a host whose guests are pinned"
    why = (
        "kernel.numa_balancing periodically unmaps guest memory to see which node touches it, then migrates "
        "pages. Guests pinned with <vcpupin>/<numatune> are placed already, so they only pay for the page "
        "faults and migrations; tuned's network-latency and realtime profiles and the RHEL guide turn it off "
        "when placement is manual."
    )
    fix_kind = "sysctl"
    fix_description = "kernel.numa_balancing = 0 in /etc/sysctl.d/90-kvmtune.conf while guests are pinned."
    fix_safe = True
    references = (
        "tuned profiles/network-latency/tuned.conf: kernel.numa_balancing=0",
        "RHEL 9 Optimizing virtual machine performance, 'Configuring NUMA in a multi-host environment' / "
        "'vCPU pinning': automatic NUMA balancing vs manual placement",
        "Documentation/admin-guide/sysctl/kernel.rst: numa_balancing",
        "OpenStack Nova hw:cpu_policy=dedicated, hw:numa_nodes (pinned, NUMA-placed guests)",
    )
    verify = HostFixExperiment()

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        pinned = facts.pinned_guest_cpus
        if not pinned:
            return
        value = facts.sysctl_int("kernel.numa_balancing")
        if not value:
            return
        yield self.finding(
            target=self.at(ctx, "sysctl:kernel.numa_balancing"),
            actual=f"{value} with {len(pinned)} pinned QEMU process(es) on CPUs {format_cpu_list(facts.pinned_cpus)}",
            expected="0 (placement is manual)",
            evidence=facts.sysctl_evidence("kernel.numa_balancing") + "; /proc/<qemu pid>/task/*/status",
        )
