from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.host.parsers import parse_int
from kvmtune.rules.host import HostFactsRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts

LATENCY_PROFILES = ("latency", "realtime", "cpu-partitioning")  # tuned profiles that legitimately set dirty 10/3


class OutdatedTuningProfile(HostFactsRule):
    id = "KVM-HST-021"
    slug = "outdated-tuning-profile"
    topic = "tuned-profile"
    severity = Severity.LOW
    also_severities = (Severity.MEDIUM,)  # what some findings are raised or lowered to
    title = "Host carries values of a 2012–2020 tuning profile copied by hand"
    why = (
        "tuned has since dropped the scheduler granularity and migration-cost sysctls (2021, 'drop sched_ "
        "tuning where appropriate'), the elevator= setting (2013) and THP=always from virtual-host (2013), and "
        "moved dirty limits to percentages of available memory. A host still showing the old values follows "
        "a frozen copy: it misses what tuned learned since, and its values fight the kernel's newer defaults."
    )
    fix_kind = "manual"
    fix_description = (
        "Remove the hand-copied lines from /etc/sysctl.conf, sysctl.d and the kernel command line, then "
        "'tuned-adm profile virtual-host' (tuned-adm verify shows what it sets)."
    )
    references = (
        "tuned commit c6d6fdc (2021, rhbz#1957829): drop sched_ tuning where appropriate",
        "tuned commit ef339e1 (2013-11): elevator and THP lines removed from virtual-host/throughput-performance",
        "tuned v2.10.0 latency-performance: vm.dirty_ratio=10, vm.dirty_background_ratio=3, sched_migration_cost_ns=5000000",
        "tuned 2012 virtual-host: vm.dirty_ratio=10, vm.dirty_background_ratio=5",
    )

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        markers: list[str] = []
        where: list[str] = []
        profile = facts.tuned_profile
        latency_profile = bool(profile) and any(p in (profile or "") for p in LATENCY_PROFILES)

        dirty = facts.sysctl_int("vm.dirty_ratio")
        background = facts.sysctl_int("vm.dirty_background_ratio")
        if dirty == 10 and background == 3 and not latency_profile:
            markers.append("vm.dirty_ratio=10/dirty_background_ratio=3 (tuned latency-performance values)")
        elif dirty == 10 and background == 5:
            markers.append("vm.dirty_ratio=10/dirty_background_ratio=5 (2012 tuned virtual-host)")
        if markers:
            where.append(facts.sysctl_evidence("vm.dirty_ratio"))

        mig = facts.sysctl_int("kernel.sched_migration_cost_ns")
        mig_path = facts.sysctl_path("kernel.sched_migration_cost_ns")
        if mig is None:  # 5.13+ moved it to debugfs (root only; unreadable is not an error here)
            mig_path = "/sys/kernel/debug/sched/migration_cost_ns"
            mig = facts.parsed(mig_path, parse_int, quiet=True)
        if mig == 5_000_000:
            markers.append("sched_migration_cost_ns=5000000 (dropped from tuned in 2021)")
            where.append(facts.sysctl_evidence("kernel.sched_migration_cost_ns") if "proc" in mig_path else mig_path)

        gran = facts.sysctl_int("kernel.sched_min_granularity_ns")
        wake = facts.sysctl_int("kernel.sched_wakeup_granularity_ns")
        if gran == 10_000_000 and wake == 15_000_000:
            markers.append("sched_min_granularity_ns=10000000/sched_wakeup_granularity_ns=15000000 (2012 throughput-performance)")
            where.append(facts.sysctl_evidence("kernel.sched_min_granularity_ns"))

        elevator = facts.kernel_cmdline.get("elevator")
        if elevator:
            markers.append(f"elevator={elevator} on the kernel command line (ignored by blk-mq kernels)")
            where.append("/proc/cmdline")

        thp = facts.thp
        if markers and thp is not None and thp.enabled is not None and thp.enabled.current == "always":
            markers.append("transparent_hugepage=always (removed from tuned virtual-host in 2013)")
            where.append(f"{thp.base}/enabled")

        if not markers:
            return
        yield self.finding(
            target=self.at(ctx, "tuning"),
            severity=Severity.MEDIUM if len(markers) >= 2 else Severity.LOW,
            actual="; ".join(markers) + (f" (tuned active profile: {profile})" if profile else " (tuned not active)"),
            expected="current tuned virtual-host profile, no hand-copied scheduler/dirty/elevator values",
            evidence=", ".join(where),
        )
