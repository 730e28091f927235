from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.verifyplan import HostFixExperiment
from kvmtune.host.parsers import format_cpu_mask
from kvmtune.host.settings import rps_want
from kvmtune.rules.host import HostFactsRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


class RpsSingleQueue(HostFactsRule):
    id = "KVM-HST-016"
    slug = "rps-off-single-queue"
    topic = "rps"
    severity = Severity.LOW
    title = "Single-queue NIC without Receive Packet Steering"
    why = (
        "A NIC with one receive queue raises its interrupts on one CPU, which then does all protocol and "
        "bridging work for every guest. RPS spreads that work; seed 002 got its best results with the mask "
        "covering the host's CPUs, and the kernel's scaling.rst suggests the CPUs of the NIC's NUMA node."
    )
    fix_kind = "udev"
    fix_description = (
        "echo MASK > /sys/class/net/DEV/queues/rx-0/rps_cpus (persist with a udev rule), MASK = CPUs of "
        "the NIC's NUMA node."
    )
    fix_safe = True
    references = (
        "seed:002 (RPS bitmap of all host CPUs gave the best overall improvement)",
        "Linux Documentation/networking/scaling.rst: RPS configuration",
    )
    verify = HostFixExperiment()

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        cpus = facts.online_cpus or set()
        for dev in sorted(facts.net_devices.values(), key=lambda d: d.name):
            want = rps_want(facts, dev)
            if want is None:
                continue
            yield self.finding(
                target=self.at(ctx, f"net:{dev.name}"),
                actual=f"1 receive queue, rps_cpus 0 ({len(cpus)} CPUs online)",
                expected=f"rps_cpus {format_cpu_mask(want)} (CPUs {min(want)}-{max(want)})",
                evidence=f"{dev.path}/queues/rx-0/rps_cpus",
            )
