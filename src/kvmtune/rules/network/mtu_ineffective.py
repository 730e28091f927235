from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.rules.common import is_virtio_model, low

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest

MTU_MIN, MTU_MAX = 68, 65535
# interface types on which libvirt can set an MTU (qemuDomainNetSupportsMTU)
MTU_TYPES = {"network", "bridge", "ethernet", "vhostuser"}


class MtuIneffective(GuestRule):
    id = "KVM-NET-007"
    slug = "mtu-ineffective"
    topic = "mtu"
    judges_only = "nics"
    severity = Severity.LOW
    also_severities = (Severity.MEDIUM,)  # what some findings are raised or lowered to
    title = "<mtu> that does not reach the guest (non-virtio NIC, unsupported type or impossible size)"
    why = (
        "libvirt applies <mtu size> to the host side (tap, bridge port) and tells the guest through virtio-net's "
        "host_mtu; an emulated NIC never learns it, so the guest keeps 1500 and the jumbo frames seed 002 "
        "measured (up to +120 % throughput between guests on one host) never happen, or the two ends disagree "
        "and large packets are dropped. Sizes outside 68..65535 and interface types libvirt cannot set an MTU "
        "on are rejected or ignored."
    )
    fix_kind = "manual"
    fix_description = (
        "Use <model type='virtio'/> with the <mtu>, a size between 68 and 65535 matching the bridge, "
        "or drop the element."
        " Not automatic: the right MTU is the network's, and a model change alters the guest's hardware."
    )
    fix_safe = False
    references = (
        "seed:002 (large MTU: up to 120 % better between guests on one host, 5-20 % across hosts; whole path must agree)",
        "libvirt formatdomain: MTU configuration (since 3.1.0, host_mtu for virtio)",
        "libvirt qemu_validate.c: setting MTU on interface type ... is not supported",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        for nic in guest.nics:
            if nic.mtu is None:
                continue
            kind = low(nic.type)
            passt = kind == "user" and low(nic.backend) == "passt"
            if not MTU_MIN <= nic.mtu <= MTU_MAX:
                actual, severity = f"mtu {nic.mtu} (outside {MTU_MIN}..{MTU_MAX})", Severity.MEDIUM
            elif guest.origin_kind != "cmdline" and kind not in MTU_TYPES and not passt:
                actual, severity = f"mtu {nic.mtu} on interface type '{kind}' (libvirt cannot set it)", Severity.MEDIUM
            elif not is_virtio_model(nic.model) and kind != "vhostuser":
                actual, severity = f"mtu {nic.mtu} on a {low(nic.model) or 'default-model'} NIC (guest is not told)", Severity.LOW
            else:
                continue
            yield self.finding(
                target=self.target(guest, nic.label),
                actual=actual,
                expected="mtu 68..65535 on a virtio NIC of type network/bridge/ethernet/vhostuser",
                evidence=nic.where("mtu"),
                source=guest.origin,
                severity=severity,
            )
