from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.kubevirt.form import KubevirtForm
from kvmtune.kubevirt.guest import quantity, resources, spec_of

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.kubevirt.guest import Spec
    from kvmtune.model.guest import Guest

MIB = 1024 * 1024


def _mib(value: float) -> str:
    return f"{value / MIB:g} MiB"


def _hugepages(spec: Spec) -> dict[str, object] | None:
    pages = spec.get("domain.memory.hugepages")
    if not isinstance(pages, dict):
        pages = spec.itype("memory", "hugepages")
    return pages if isinstance(pages, dict) else None


class HugepagesRequestMismatch(GuestRule):
    id = "KVM-KUB-010"
    slug = "kubevirt-hugepages-request-mismatch"
    topic = "hugepages"
    severity = Severity.HIGH
    title = "KubeVirt VM backed by hugepages whose memory request does not match the guest's memory or the page size"
    why = (
        "Hugepages cannot be overcommitted. KubeVirt gives the virt-launcher pod hugepages of the memory request "
        "(the smaller of requests.memory and memory.guest) and backs all of memory.guest with them: with a request "
        "below the guest's memory the guest runs into the pod's hugepage limit and QEMU fails. A request that is "
        "smaller than the page size or not a multiple of it is refused by KubeVirt's admission webhook, so the VM "
        "never starts; a request above memory.guest reserves the rest as ordinary memory that the guest never gets."
    )
    fix_kind = "manual"
    fix_description = ("KubeVirt: set resources.requests.memory to memory.guest, a whole multiple of "
                       "memory.hugepages.pageSize.")
    fix_safe = True
    kubevirt = KubevirtForm("domain.resources.requests.memory",
                            "the value of memory.guest, a multiple of memory.hugepages.pageSize")
    references = (
        "KubeVirt user guide, compute/virtual_hardware.md (Hugepages, Limitations): the page size cannot be bigger "
        "than the requested memory, which must be divisible by it",
        "kubevirt/kubevirt pkg/virt-api/webhooks/validating-webhook/admitters/vmi-create-admitter.go "
        "validateHugepagesMemoryRequests: requests.memory (else memory.guest) smaller than or not a multiple of "
        "pageSize is refused",
        "kubevirt/kubevirt pkg/virt-controller/services/renderresources.go WithHugePages: the pod's hugepages are "
        "the request capped at memory.guest; a request above memory.guest is added to the ordinary memory request",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        spec = spec_of(guest)
        pages = _hugepages(spec) if spec is not None else None
        if spec is None or pages is None:
            return
        page = quantity(pages.get("pageSize"))
        request = quantity(resources(spec, "requests", "memory"))
        shown = quantity(spec.get("domain.memory.guest"))
        if shown is None:
            shown = quantity(spec.itype("memory", "guest"))
        at = spec.path("domain.resources.requests.memory")
        asked = request if request is not None else shown  # what the webhook checks against the page size
        if page and asked is not None and (asked < page or asked % page):
            yield self.finding(
                target=self.target(guest), evidence=at, source=guest.origin,
                actual=f"memory {_mib(asked)} with {_mib(page)} pages ("
                       f"{'smaller than a page' if asked < page else 'not a whole number of pages'})",
                expected="a whole multiple of memory.hugepages.pageSize: KubeVirt refuses the VM otherwise")
        elif request is not None and shown is not None and request < shown:
            yield self.finding(
                target=self.target(guest), evidence=at, source=guest.origin,
                actual=f"memory.guest {_mib(shown)} backed by hugepages, the pod given {_mib(request)} of them",
                expected="requests.memory equal to memory.guest (hugepages cannot be overcommitted)")
        elif request is not None and shown is not None and request > shown:
            yield self.finding(
                target=self.target(guest), evidence=at, source=guest.origin, severity=Severity.LOW,
                actual=f"requests.memory {_mib(request)}, memory.guest {_mib(shown)}: "
                       f"{_mib(request - shown)} requested as ordinary memory the guest never gets",
                expected="requests.memory equal to memory.guest")
