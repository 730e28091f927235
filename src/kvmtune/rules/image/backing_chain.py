from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.rules.image import DiskImageRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.qemu.image import DiskImage

DEEP = 3


class BackingChainDeep(DiskImageRule):
    id = "KVM-IMG-005"
    slug = "backing-chain-deep"
    topic = "backing-chain"
    severity = Severity.LOW
    also_severities = (Severity.MEDIUM,)  # what some findings are raised or lowered to
    title = "Long chain of backing files"
    why = (
        "A read of a cluster an overlay does not hold falls through to the next image, and the next: each "
        "layer costs an L2 lookup, its own L2 cache memory and an open file. Snapshot chains grown by "
        "external snapshots slow reads down step by step until they are committed or streamed."
    )
    fix_kind = "manual"
    fix_description = (
        "virsh blockcommit --active --pivot (live) or qemu-img commit / qemu-img rebase to flatten the chain."
        " Not automatic: which snapshots may be merged away is the administrator's decision."
    )
    references = (
        "QEMU docs/interop/live-block-operations.rst (block-commit, block-stream)",
        "QEMU docs/qcow2-cache.txt (one L2 cache per image in the chain)",
    )

    def check_disk_image(self, image: DiskImage, ctx: AuditContext) -> Iterator[Finding]:
        depth = len(image.backing_chain)
        if depth < DEEP:
            return
        yield self.finding(
            target=self.at(ctx, image),
            severity=Severity.MEDIUM if depth >= 2 * DEEP else Severity.LOW,
            actual=f"{depth} backing files: " + " → ".join(image.backing_chain),
            expected=f"fewer than {DEEP} (commit or stream old snapshots)",
            evidence="qemu-img info --backing-chain",
        )
