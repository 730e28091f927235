from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import NoExperiment
from kvmtune.rules.common import data_disks, low

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class DetectZeroesWithDiscard(GuestRule):
    id = "KVM-STO-020"
    slug = "detect-zeroes-on-with-discard"
    topic = "discard"
    judges_only = "disks"
    severity = Severity.LOW
    title = "detect_zeroes='on' on a disk that passes discards: zero writes still allocate"
    why = (
        "With detect_zeroes='on' QEMU turns a guest's write of zeroes into a write-zeroes request, which keeps "
        "the clusters allocated. On a disk that already passes discards (discard='unmap') the value 'unmap' turns "
        "the same writes into discards, so zero-filling a region frees it in the image, as an fstrim would."
    )
    fix_kind = "xml"
    fix_description = "<driver discard='unmap' detect_zeroes='unmap'/> (takes effect at the next guest start)."
    fix_safe = True
    references = (
        "libvirt formatdomain 'Hard drives': driver detect_zeroes (off, on, unmap; unmap only with discard='unmap')",
        "QEMU qapi/block-core.json: BlockdevDetectZeroesOptions (off, on, unmap)",
    )
    verify = NoExperiment("detect_zeroes='unmap' changes what zero writes leave allocated, not their speed")

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        for disk in data_disks(guest, writable=True):
            if low(disk.discard) != "unmap" or low(disk.detect_zeroes) != "on":
                continue
            yield self.finding(
                target=self.target(guest, disk.label),
                actual="discard=unmap, detect_zeroes=on",
                expected="detect_zeroes=unmap",
                evidence=disk.where("detect_zeroes"),
                source=guest.origin,
            )
