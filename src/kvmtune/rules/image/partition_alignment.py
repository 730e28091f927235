from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.qemu.partitions import alignment_of, classify_alignment, scan_line
from kvmtune.rules.image import DiskImageRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.qemu.image import DiskImage

MIB = 1024 * 1024


class PartitionMisaligned(DiskImageRule):
    id = "KVM-IMG-009"
    slug = "partition-misaligned"
    topic = "partition-alignment"
    severity = Severity.HIGH
    also_severities = (Severity.INFO, Severity.MEDIUM)  # what some findings are raised or lowered to
    title = "Partition inside the image does not start on a 4 KiB (or 1 MiB) boundary"
    why = (
        "Seed 000: a partition starting at sector 63 (32,256 bytes) makes every 4 KiB guest block straddle two "
        "host pages, so one guest write becomes up to two reads and two writes on the host (read-modify-write, "
        "an I/O multiplication factor of four). virt-alignment-scan calls anything below 4K bad, below 64K bad "
        "on network storage; current tools start partitions at 1 MiB."
    )
    fix_kind = "manual"
    fix_description = (
        "virt-resize --align-first always OLD NEW (moves the partitions; guest stopped), or reinstall with "
        "partitions at 1 MiB (sector 2048) boundaries."
    )
    references = (
        "seed:000 (Partitions for disk image files: sector 63, read-modify-write, factor of four)",
        "libguestfs guestfs-tools align/scan.c and virt-alignment-scan(1): < 4K bad, < 64K bad, else ok",
    )

    def check_disk_image(self, image: DiskImage, ctx: AuditContext) -> Iterator[Finding]:
        table = image.partitions
        if table is None or table.scheme == "none":
            return
        for part in table.partitions:
            align = alignment_of(part.start)
            if align >= MIB:
                continue
            verdict = classify_alignment(part.start)
            if not part.carries_io:
                sev = Severity.INFO
            elif align < 4096:
                sev = Severity.HIGH
            elif align < 65536:
                sev = Severity.MEDIUM
            else:
                sev = Severity.INFO
            yield self.finding(
                target=self.at(ctx, image, f"{image.label} partition {part.number}"),
                severity=sev,
                actual=f"{table.scheme.upper()} partition {part.number} ({part.type}) starts at sector "
                f"{part.start_sector} = byte {part.start}: {verdict}",
                expected="start on a 1 MiB boundary (sector 2048); at the very least 4 KiB (sector multiple of 8)",
                evidence="virt-alignment-scan view: " + scan_line("/dev/sda", part),
                summary=None if sev >= Severity.MEDIUM else "Partition not on a 1 MiB boundary",
            )
