from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.verifyplan import HostFixExperiment
from kvmtune.host.settings import NOTSENT_LOWAT, TCP_BUFFER_MAX, VERY_FAST_NIC_MBPS, fast_nics
from kvmtune.rules.host import HostFactsRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


class TcpBuffersSmallForFastNic(HostFactsRule):
    id = "KVM-HST-013"
    slug = "tcp-buffers-small-for-fast-nic"
    topic = "tcp-sysctl"
    severity = Severity.LOW
    also_severities = (Severity.INFO,)  # what some findings are raised or lowered to
    title = "TCP buffer maxima too small for the host's 10G+ NICs"
    why = (
        "A TCP flow can only keep window-size bytes in flight: at 10 Gbit/s and 5 ms round trip that is about "
        "6 MiB. Seed 002 recommends 16 MiB or more for 10G adapters; tuned's network-throughput profile sets "
        "tcp_rmem/tcp_wmem maxima of 16 MiB. On a KVM host this matters for the host's own flows: live "
        "migration, NFS/iSCSI storage and user-mode guest networking."
    )
    fix_kind = "sysctl"
    fix_description = (
        "net.ipv4.tcp_rmem = 4096 131072 16777216 and net.ipv4.tcp_wmem = 4096 16384 16777216 in "
        "/etc/sysctl.d/90-kvmtune.conf (or tuned's network-throughput profile)."
    )
    fix_safe = True
    references = (
        "seed:002 (tcp_rmem/tcp_wmem maximum 16M or higher for 10 Gigabit adapters)",
        "tuned profiles/network-throughput/tuned.conf: tcp_rmem=\"4096 131072 16777216\", tcp_wmem=\"4096 16384 16777216\"",
        "Linux Documentation/networking/ip-sysctl.rst: tcp_rmem, tcp_wmem",
    )
    verify = HostFixExperiment()

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        fast = fast_nics(facts)
        if not fast:
            return
        nics = ", ".join(f"{d.name} {d.speed_mbps // 1000 if d.speed_mbps else '?'}G" for d in fast)
        if any((d.speed_mbps or 0) >= VERY_FAST_NIC_MBPS for d in fast):
            # tuned network-throughput: "generally only necessary on older CPUs or 40G+ networks"
            idle = facts.sysctl_int("net.ipv4.tcp_slow_start_after_idle")
            if idle == 1:
                yield self.finding(
                    target=self.at(ctx, "sysctl:net.ipv4.tcp_slow_start_after_idle"),
                    severity=Severity.INFO,
                    actual=f"1 with {nics}",
                    expected="0 (tuned network-throughput)",
                    evidence=facts.sysctl_evidence("net.ipv4.tcp_slow_start_after_idle"),
                    summary="Idle TCP connections restart from a small window on a 40G+ host",
                )
            lowat = facts.sysctl_int("net.ipv4.tcp_notsent_lowat")
            if lowat is not None and lowat > NOTSENT_LOWAT:
                yield self.finding(
                    target=self.at(ctx, "sysctl:net.ipv4.tcp_notsent_lowat"),
                    severity=Severity.INFO,
                    actual=f"{lowat} with {nics}",
                    expected="131072 (tuned network-throughput)",
                    evidence=facts.sysctl_evidence("net.ipv4.tcp_notsent_lowat"),
                    summary="Unsent data per socket unbounded on a 40G+ host",
                )
        for key in ("net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"):
            values = facts.sysctl_ints(key, 3)
            if values is None or values[2] >= TCP_BUFFER_MAX:
                continue
            yield self.finding(
                target=self.at(ctx, f"sysctl:{key}"),
                actual=f"maximum {values[2]} bytes ({values[2] / 1048576:.1f} MiB) with {nics}",
                expected=f"maximum ≥ {TCP_BUFFER_MAX} (16 MiB)",
                evidence=facts.sysctl_evidence(key),
            )
