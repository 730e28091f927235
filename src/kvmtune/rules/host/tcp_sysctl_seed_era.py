from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.verifyplan import HostFixExperiment
from kvmtune.host.settings import TCP_LOW_LATENCY_GONE, TSQ_LOW
from kvmtune.rules.host import HostFactsRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


class TcpSysctlSeedEra(HostFactsRule):
    id = "KVM-HST-012"
    slug = "tcp-sysctl-seed-era"
    topic = "tcp-sysctl"
    severity = Severity.LOW
    also_severities = (Severity.INFO, Severity.HIGH)  # what some findings are raised or lowered to
    title = "TCP sysctl set the way 2012–2018 tuning guides did, against today's kernel documentation"
    why = (
        "Seed 002 set tcp_tw_reuse=1 and similar knobs on hosts and guests. Today's ip-sysctl documentation "
        "says tcp_tw_reuse should stay at 2 (loopback only) unless experts ask otherwise, tcp_tw_recycle broke "
        "clients behind NAT and was removed from the kernel, and tcp_low_latency no longer does anything."
    )
    fix_kind = "sysctl"
    fix_description = "Remove the line from /etc/sysctl.conf or sysctl.d and reset the value (sysctl -w key=default)."
    fix_safe = True
    references = (
        "seed:002 (sysctl table: tcp_tw_reuse 1, tcp_fin_timeout 1, tcp_low_latency 0, cubic)",
        "Linux Documentation/networking/ip-sysctl.rst: tcp_tw_reuse (default 2), tcp_low_latency (obsolete)",
        "Linux commit 4396e46187ca (4.12): remove tcp_tw_recycle",
    )
    verify = HostFixExperiment()

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        def hit(key: str, actual: str, expected: str, summary: str, severity: Severity = Severity.LOW) -> Finding:
            return self.finding(
                target=self.at(ctx, f"sysctl:{key}"),
                severity=severity,
                actual=actual,
                expected=expected,
                evidence=facts.sysctl_evidence(key),
                summary=summary,
            )

        reuse = facts.sysctl_int("net.ipv4.tcp_tw_reuse")
        if reuse == 1:
            yield hit(
                "net.ipv4.tcp_tw_reuse", "1 (seed 002's advice)", "2 (the default: reuse for loopback only)",
                "tcp_tw_reuse=1 reuses TIME-WAIT sockets for all peers",
            )
        recycle = facts.sysctl_int("net.ipv4.tcp_tw_recycle")
        if recycle is not None and recycle != 0:
            yield hit(
                "net.ipv4.tcp_tw_recycle", str(recycle), "0 (the knob is gone since Linux 4.12)",
                "tcp_tw_recycle drops connections from clients behind NAT", Severity.HIGH,
            )
        low = facts.sysctl_int("net.ipv4.tcp_low_latency")
        if low == 1 and (facts.kernel_version or (0, 0)) >= TCP_LOW_LATENCY_GONE:
            yield hit(
                "net.ipv4.tcp_low_latency", "1", "unset (no effect since Linux 4.14)",
                "tcp_low_latency is set but does nothing on this kernel", Severity.INFO,
            )
        tsq = facts.sysctl_int("net.ipv4.tcp_limit_output_bytes")
        if tsq is not None and tsq < TSQ_LOW:
            yield hit(
                "net.ipv4.tcp_limit_output_bytes", f"{tsq} (seed 002 used 131072)",
                "the kernel default (1 MiB or more on current kernels)",
                "TCP Small Queues limit lowered: fast flows cannot keep the link busy", Severity.LOW,
            )
        cc = facts.sysctl("net.ipv4.tcp_congestion_control")
        if cc == "reno":
            yield hit(
                "net.ipv4.tcp_congestion_control", "reno", "cubic (the default since 2.6.19) or bbr",
                "TCP uses Reno congestion control", Severity.LOW,
            )
