from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import NoExperiment
from kvmtune.rules.common import low

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest

DEFAULT_SUMMARY = "macvtap without a mode: libvirt's default (VEPA) sends guest-to-guest traffic to the switch"


class MacvtapVepa(GuestRule):
    id = "KVM-NET-005"
    slug = "macvtap-vepa"
    topic = "net-backend"
    judges_only = "nics"
    severity = Severity.MEDIUM
    title = "macvtap in VEPA mode: traffic between guests on this host leaves through the external switch"
    why = (
        "In VEPA mode (libvirt's default for type='direct') a macvtap endpoint sends every frame out of the "
        "physical port, even to a guest on the same host; it only comes back if the switch supports hairpin "
        "mode, and most do not, so guest-to-guest traffic is either lost or crosses the wire twice. Bridge mode "
        "switches it inside the host; seed 002 recommends it where guests talk to each other."
    )
    fix_kind = "xml"
    fix_description = (
        "Set <source dev='...' mode='bridge'/>; keep vepa only if the switch is meant to see and police guest traffic."
    )
    fix_safe = True
    references = (
        "seed:002 (MacVTap modes: VEPA default, hairpin needed; bridge mode for inter-guest traffic)",
        "libvirt formatdomain: direct attachment to physical interface (mode vepa default)",
    )
    verify = NoExperiment("macvtap bridge vs VEPA needs a physical lower device and an external switch; not measured")

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        for nic in guest.nics:
            if low(nic.type) != "direct":
                continue
            mode = low(nic.source_mode)
            if mode not in (None, "vepa"):
                continue
            yield self.finding(
                target=self.target(guest, nic.label),
                actual="vepa",
                summary=None if mode else DEFAULT_SUMMARY,
                expected="bridge (or passthrough for a dedicated VF)",
                evidence=nic.where("source_mode"),
                source=guest.origin,
            )
