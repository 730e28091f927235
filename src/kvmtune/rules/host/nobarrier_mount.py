from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.rules.host import HostFactsRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


class NobarrierMount(HostFactsRule):
    id = "KVM-HST-022"
    slug = "nobarrier-mount"
    topic = "tuned-profile"
    severity = Severity.CRITICAL
    title = "File system mounted without write barriers"
    why = (
        "nobarrier (barrier=0) lets the disk reorder or cache writes past a journal commit; after a power "
        "loss the file system and every guest image on it can be corrupted. The 2012 tuned virtual-guest and "
        "throughput-performance scripts remounted with nobarrier; tuned removed it in January 2013 for data "
        "loss prevention."
    )
    fix_kind = "manual"
    fix_description = "Remove nobarrier/barrier=0 from /etc/fstab and remount (mount -o remount,barrier MOUNTPOINT)."
    references = (
        "tuned commit 0f912ed (2013-01-03): removed nobarrier from the virtual-guest profile (data loss prevention)",
        "Linux Documentation/admin-guide/ext4.rst: barrier=0 is not recommended",
    )

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        for m in facts.mounts:
            if m.has_option("nobarrier", "barrier=0"):
                opt = "nobarrier" if "nobarrier" in m.options else "barrier=0"
                yield self.finding(
                    target=self.at(ctx, f"mount:{m.mountpoint}"),
                    actual=f"{m.fstype} {m.device} on {m.mountpoint} with {opt}",
                    expected="write barriers on (the default)",
                    evidence="/proc/mounts",
                )
