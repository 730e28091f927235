from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.verifyplan import HostFixExperiment
from kvmtune.host.settings import TAP_QLEN
from kvmtune.rules.host import HostFactsRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts

KINDS = ("bridge", "tap", "macvtap")


class TxQueueLen(HostFactsRule):
    id = "KVM-HST-015"
    slug = "txqueuelen-guest-ports"
    topic = "txqueuelen"
    severity = Severity.LOW
    also_severities = (Severity.INFO,)  # what some findings are raised or lowered to
    title = "Transmit queue of a bridge, tap or macvtap drops packets, or is blown up without need"
    why = (
        "For a tap the host's transmit queue is the path into the guest: when it overflows the guest loses "
        "packets and TCP backs off. Seed 002 found txqueuelen 2500 best in its tests; today's practice raises it "
        "only where the device shows tx drops (multiqueue virtio-net and vhost address the cause), because a "
        "needlessly long queue adds latency."
    )
    fix_kind = "udev"
    fix_description = (
        "ip link set dev X txqueuelen 2500 for a dropping tap/macvtap (persist with a udev rule or libvirt hook); "
        "prefer virtio-net multiqueue (<driver queues='N'/>) with vhost."
    )
    fix_safe = True
    references = (
        "seed:002 (txqueuelen 2500 produced the best results; too large adds latency)",
        "Linux include/uapi/linux/if_tun.h: TUN_READQ_SIZE 500 (tap default)",
        "libvirt formatdomain: interface driver queues",
    )
    verify = HostFixExperiment()

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        for dev in sorted(facts.net_devices.values(), key=lambda d: d.name):
            if dev.kind not in KINDS or dev.tx_queue_len is None:
                continue
            if dev.tx_dropped and dev.tx_dropped > 0 and dev.tx_queue_len < TAP_QLEN and dev.kind != "bridge":
                yield self.finding(
                    target=self.at(ctx, f"net:{dev.name}"),
                    actual=f"txqueuelen {dev.tx_queue_len}, {dev.tx_dropped} packets dropped on transmit",
                    expected=f"txqueuelen ≥ {TAP_QLEN} (seed 002) or a multiqueue vhost NIC",
                    evidence=f"{dev.path}/tx_queue_len, {dev.path}/statistics/tx_dropped",
                )
            elif dev.tx_queue_len >= 10_000 and not dev.tx_dropped:
                note = " (a bridge has no queue: the setting does nothing)" if dev.kind == "bridge" else ""
                yield self.finding(
                    target=self.at(ctx, f"net:{dev.name}"),
                    severity=Severity.INFO,
                    actual=f"txqueuelen {dev.tx_queue_len} with no transmit drops{note}",
                    expected=f"the default ({'1000' if dev.kind == 'bridge' else '500–1000'}) unless drops show",
                    evidence=f"{dev.path}/tx_queue_len, {dev.path}/statistics/tx_dropped",
                    summary="Very long transmit queue without drops to justify it",
                    fix_kind="manual",  # who raised it, and why, is not on the host: fix --host leaves it
                    fix_description="Find what raised it (udev rule, network scripts) and drop that setting.",
                )
