from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.host.parsers import format_cpu_list
from kvmtune.host.settings import EPB_PERFORMANCE, GOVERNOR
from kvmtune.rules.host import HostFactsRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


class CpuGovernor(HostFactsRule):
    id = "KVM-HST-040"
    slug = "cpu-governor-not-performance"
    topic = "cpu-power"
    severity = Severity.MEDIUM
    also_severities = (Severity.LOW,)
    title = "CPU frequency governor or energy/performance bias favours power over guests"
    why = (
        "A power-saving governor lowers the clock between bursts, so a vCPU that wakes for an interrupt runs "
        "slowly until the governor notices; tuned's virtual-host and latency profiles set governor=performance "
        "and energy_perf_bias=performance."
    )
    fix_kind = "manual"
    fix_description = (
        "tuned-adm profile virtual-host (or cpupower frequency-set -g performance; x86_energy_perf_policy "
        "performance). kvmtune does not write these itself: the governor belongs to tuned, cpupower.service or "
        "power-profiles-daemon, which would overwrite a value written behind their back."
    )
    fix_safe = True
    references = (
        "tuned profiles/throughput-performance/tuned.conf and latency-performance/tuned.conf: [cpu] "
        "governor=performance, energy_perf_bias=performance (virtual-host includes throughput-performance)",
        "RHEL 9 Configuring and managing virtualization, 'Optimizing virtual machine performance': tuned virtual-host",
        "Documentation/admin-guide/pm/cpufreq.rst (scaling_governor)",
    )

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        if not facts.kvm_loaded and not facts.guests:
            return
        slow = {cpu: gov for cpu, gov in facts.cpu_governors.items() if gov != GOVERNOR}
        if slow:
            names = sorted(set(slow.values()))
            yield self.finding(
                target=self.at(ctx, "cpufreq:scaling_governor"),
                actual=f"{'/'.join(names)} on CPUs {format_cpu_list(set(slow))}",
                expected=f"{GOVERNOR} (tuned virtual-host)",
                evidence="/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor",
            )
        biased = {cpu: v for cpu, v in facts.energy_perf_bias.items() if v > EPB_PERFORMANCE}
        if biased:
            yield self.finding(
                target=self.at(ctx, "cpu:energy_perf_bias"),
                actual=f"{max(biased.values())} on CPUs {format_cpu_list(set(biased))}",
                expected=f"{EPB_PERFORMANCE} (performance)",
                evidence="/sys/devices/system/cpu/cpu*/power/energy_perf_bias",
                severity=Severity.LOW,
            )
