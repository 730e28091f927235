from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.kubevirt.form import KubevirtForm
from kvmtune.kubevirt.guest import spec_of, windows_reason

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest

# the enlightenments KubeVirt's Windows example VMI turns on, the ones Windows gains most from
ESSENTIAL = ("relaxed", "vapic", "spinlocks")


class WindowsNoHyperv(GuestRule):
    id = "KVM-KUB-008"
    slug = "kubevirt-windows-no-hyperv"
    topic = "hyperv"
    severity = Severity.MEDIUM
    title = "KubeVirt Windows VM without Hyper-V enlightenments (or without relaxed, vapic, spinlocks)"
    why = (
        "Windows runs best when it knows it is virtualised: the Hyper-V enlightenments let it skip watchdog "
        "timeouts under load (relaxed), avoid trapping on every interrupt acknowledgement (vapic) and yield a "
        "spinning vCPU instead of burning it (spinlocks). KubeVirt turns none of them on unless "
        "spec.domain.features.hyperv (or the preference's preferredHyperv) asks."
    )
    fix_kind = "manual"
    fix_description = ("KubeVirt: set spec.template.spec.domain.features.hyperv: {relaxed: {}, vapic: {}, "
                       "spinlocks: {spinlocks: 8191}} (restart).")
    fix_safe = True
    kubevirt = KubevirtForm("domain.features.hyperv", "{relaxed: {}, vapic: {}, spinlocks: {spinlocks: 8191}}",
                            "as KubeVirt's Windows example VMI has them",
                            setting={"relaxed": {}, "vapic": {}, "spinlocks": {"spinlocks": 8191}})
    references = (
        "KubeVirt user guide, compute/virtual_hardware.md: Hyper-V optimizations (features.hyperv)",
        "kubevirt/kubevirt examples/vmi-windows.yaml: relaxed, vapic, spinlocks 8191, the hyperv timer",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        spec = spec_of(guest)
        reason = windows_reason(spec) if spec is not None else None
        if spec is None or reason is None:
            return
        hyperv: Any = spec.get("domain.features.hyperv")
        if not isinstance(hyperv, dict):
            hyperv = spec.pref("features", "preferredHyperv")
        missing = [name for name in ESSENTIAL if not _on(hyperv, name)] if isinstance(hyperv, dict) else list(ESSENTIAL)
        if not missing:
            return
        yield self.finding(
            target=self.target(guest, "features:hyperv"),
            actual=f"missing: {', '.join(missing)} (Windows by {reason})",
            expected=", ".join(ESSENTIAL) + " on",
            evidence=spec.path("domain.features.hyperv"),
            source=guest.origin,
            confidence="likely",
        )


def _on(hyperv: dict[str, Any], name: str) -> bool:
    value = hyperv.get(name)
    return isinstance(value, dict) and value.get("enabled", True) is not False
