from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.verifyplan import NoExperiment
from kvmtune.host.settings import BACKLOG
from kvmtune.rules.host import HostFactsRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


class NetdevBacklog(HostFactsRule):
    id = "KVM-HST-023"
    slug = "netdev-backlog"
    topic = "tcp-sysctl"
    severity = Severity.LOW
    also_severities = (Severity.INFO,)  # what some findings are raised or lowered to
    title = "net.core.netdev_max_backlog does not match the drops the host sees"
    why = (
        "Packets a tap or a non-NAPI device hands to the kernel wait in a per-CPU backlog of "
        "netdev_max_backlog packets; a full backlog drops them (column 2 of /proc/net/softnet_stat). Seed 002 "
        "used 25000 for its adapters; the kernel's scaling.rst reports 1000 or 10000 performing well and a "
        "larger queue only adds latency when nothing is dropped."
    )
    fix_kind = "sysctl"
    fix_description = "net.core.netdev_max_backlog = 10000 in /etc/sysctl.d/90-kvmtune.conf when softnet_stat shows drops."
    fix_safe = True
    references = (
        "seed:002 (net.core.netdev_max_backlog 25000)",
        "Linux Documentation/networking/scaling.rst: netdev_max_backlog 1000 or 10000",
        "Linux Documentation/admin-guide/sysctl/net.rst: netdev_max_backlog",
    )
    verify = NoExperiment("netdev_max_backlog is not per namespace and matters only under receive bursts that drop")

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        backlog = facts.sysctl_int("net.core.netdev_max_backlog")
        softnet = facts.softnet
        if backlog is None or softnet is None:
            return
        dropped = sum(c.dropped for c in softnet)
        key = "net.core.netdev_max_backlog"
        if dropped > 0 and backlog < BACKLOG:
            yield self.finding(
                target=self.at(ctx, f"sysctl:{key}"),
                actual=f"{backlog}, {dropped} packets dropped from full backlogs since boot",
                expected=f"{BACKLOG}",
                evidence=facts.sysctl_evidence(key) + ", /proc/net/softnet_stat column 2",
            )
        elif dropped == 0 and backlog > BACKLOG:
            yield self.finding(
                target=self.at(ctx, f"sysctl:{key}"),
                severity=Severity.INFO,
                actual=f"{backlog} with no backlog drops since boot",
                expected=f"1000–{BACKLOG} unless /proc/net/softnet_stat shows drops",
                evidence=facts.sysctl_evidence(key) + ", /proc/net/softnet_stat column 2",
                summary="netdev_max_backlog raised far beyond need",
            )
