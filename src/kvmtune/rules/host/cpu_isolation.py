from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.host.parsers import format_cpu_list
from kvmtune.host.settings import LATENCY_TUNED_PROFILES
from kvmtune.rules.host import HostFactsRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


class PinnedWithoutIsolation(HostFactsRule):
    id = "KVM-HST-046"
    slug = "pinned-cpus-not-isolated"
    topic = "cpu-isolation"
    severity = Severity.MEDIUM
    title = "Guests are pinned for latency but their CPUs are not isolated (isolcpus / nohz_full)"
    why = (
        "Pinning keeps a vCPU on its CPU but does not keep other tasks, kernel threads and the scheduler tick "
        "off it. On a host tuned for latency the CPUs given to guests are isolated from the scheduler "
        "(isolcpus) and from the periodic tick (nohz_full), as tuned's realtime-virtual-host and "
        "cpu-partitioning profiles do with isolated_cores."
    )
    fix_kind = "manual"
    fix_description = (
        "Set isolated_cores=<pinned CPUs> in /etc/tuned/realtime-virtual-host-variables.conf (or "
        "cpu-partitioning-variables.conf) and activate the profile, or add isolcpus=managed_irq,domain,<CPUs> "
        "nohz_full=<CPUs> rcu_nocbs=<CPUs> to the kernel command line. Not automatic: it needs the boot loader "
        "and a reboot, and the housekeeping CPUs are the operator's choice."
    )
    fix_safe = False
    references = (
        "tuned profiles/realtime-virtual-host/tuned.conf and cpu-partitioning: isolated_cores, isolcpus, nohz_full",
        "Documentation/admin-guide/kernel-parameters.txt: isolcpus, nohz_full, rcu_nocbs",
        "RHEL 9 Optimizing virtual machine performance: vCPU pinning and isolating CPUs",
        "OpenStack Nova hw:cpu_policy=dedicated with cpu_dedicated_set (host CPUs reserved for pinned guests)",
    )

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        pinned = facts.pinned_cpus
        if not pinned or facts.tuned_profile not in LATENCY_TUNED_PROFILES:
            return  # pinning for placement alone (throughput) does not need isolation
        isolated = facts.cmdline_cpus("isolcpus")
        tickless = facts.cmdline_cpus("nohz_full")
        missing = pinned - (isolated & tickless) if isolated or tickless else pinned
        if not missing:
            return
        have = []
        if isolated:
            have.append(f"isolcpus={format_cpu_list(isolated)}")
        if tickless:
            have.append(f"nohz_full={format_cpu_list(tickless)}")
        yield self.finding(
            target=self.at(ctx, "cmdline:isolcpus"),
            actual=(f"guests pinned to CPUs {format_cpu_list(pinned)} under tuned {facts.tuned_profile}; "
                    f"{' '.join(have) or 'no isolcpus/nohz_full'} (not covering {format_cpu_list(missing)})"),
            expected=f"isolcpus and nohz_full covering {format_cpu_list(pinned)}",
            evidence="/proc/cmdline; /etc/tuned/active_profile; /proc/<qemu pid>/task/*/status",
        )
