"""MBR and GPT partition tables inside a guest disk, and their alignment.

The parser is a pure function of a ``read(offset, length) -> bytes``
callable, so the same code reads a raw file, a block device or a qcow2 image
(through ``qemu-img dd``, :mod:`kvmtune.qemu.image`). Alignment is classified the way
libguestfs's ``virt-alignment-scan`` does (``align/scan.c``): the alignment of
a partition is the largest power of two dividing its start in bytes; below
4 KiB is "bad (alignment < 4K)", below 64 KiB "bad (alignment < 64K)", the
rest "ok". kvmtune additionally notes starts below 1 MiB, the boundary every
current partitioning tool uses.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field

SECTOR = 512
EXTENDED_TYPES = {0x05, 0x0F, 0x85}
GPT_PROTECTIVE = 0xEE
MAX_LOGICAL = 128
MAX_GPT_ENTRIES_BYTES = 1024 * 1024

GPT_TYPES = {
    "0fc63daf-8483-4772-8e79-3d69d8477de4": "Linux filesystem",
    "c12a7328-f81f-11d2-ba4b-00a0c93ec93b": "EFI System",
    "21686148-6449-6e6f-744e-656564454649": "BIOS boot",
    "0657fd6d-a4ab-43c4-84e5-0933c84b4f4f": "Linux swap",
    "e6d6d379-f507-44c2-a23c-238f2a3df928": "Linux LVM",
    "a19d880f-05fc-4d3b-a006-743f0f84911e": "Linux RAID",
    "ebd0a0a2-b9e5-4433-87c0-68b6b72699c7": "Microsoft basic data",
    "e3c9e316-0b5c-4db8-817d-f92df00215ae": "Microsoft reserved",
    "de94bba4-06d1-4d40-a16a-bfd50179d6ac": "Windows recovery",
    "4f68bce3-e8cd-4db1-96e7-fbcaf984b709": "Linux root (x86-64)",
}
# Partitions that hold no file system I/O: their alignment does not matter.
NO_IO_TYPES = {"BIOS boot", "Microsoft reserved"}


@dataclass(frozen=True)
class Partition:
    number: int
    start: int  # bytes from the start of the disk
    size: int  # bytes
    scheme: str  # mbr | gpt
    type: str  # "0x83" for MBR, a name or GUID for GPT
    name: str = ""

    @property
    def start_sector(self) -> int:
        return self.start // SECTOR

    @property
    def alignment(self) -> int:
        return alignment_of(self.start)

    @property
    def carries_io(self) -> bool:
        return self.type not in NO_IO_TYPES and self.size >= 1024 * 1024


@dataclass
class PartitionTable:
    scheme: str  # mbr | gpt | none
    partitions: list[Partition] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def alignment_of(start: int) -> int:
    """Largest power of two dividing ``start`` (bytes); 2**64 for 0, as virt-alignment-scan counts."""
    if start == 0:
        return 1 << 64
    return start & -start


def classify_alignment(start: int) -> str:
    """virt-alignment-scan's verdict: ``ok``, ``bad (alignment < 64K)`` or ``bad (alignment < 4K)``."""
    a = alignment_of(start)
    if a < 4096:
        return "bad (alignment < 4K)"
    if a < 65536:
        return "bad (alignment < 64K)"
    return "ok"


def format_alignment(start: int) -> str:
    a = alignment_of(start)
    if a >= 1 << 64:
        return "-"
    return f"{a}" if a < 1024 else f"{a // 1024}K"


def scan_line(device: str, part: Partition) -> str:
    """One line as virt-alignment-scan prints it: ``/dev/sda1  32256  512  bad (alignment < 4K)``."""
    return f"{device}{part.number:<3} {part.start:<11} {format_alignment(part.start):<10} {classify_alignment(part.start)}"


def _mbr_entries(sector: bytes) -> list[tuple[int, int, int]]:
    """(type, lba start, sectors) of the four slots of an MBR or EBR."""
    out = []
    for i in range(4):
        e = sector[446 + 16 * i : 446 + 16 * (i + 1)]
        ptype = e[4]
        start, count = struct.unpack("<II", e[8:16])
        out.append((ptype, start, count))
    return out


def _gpt_guid(raw: bytes) -> str:
    import uuid  # here: uuid imports platform, and most runs read no GPT

    return str(uuid.UUID(bytes_le=raw))


def parse_partition_table(read: Callable[[int, int], bytes], disk_size: int | None = None) -> PartitionTable:
    """Read the MBR (with logical partitions) or the GPT of a disk through ``read``."""
    mbr = read(0, SECTOR)
    if len(mbr) < SECTOR or mbr[510:512] != b"\x55\xaa":
        return PartitionTable("none")
    entries = _mbr_entries(mbr)
    if any(t == GPT_PROTECTIVE for t, _, _ in entries):
        gpt = _parse_gpt(read, disk_size)
        if gpt is not None:
            return gpt
    table = PartitionTable("mbr")
    for n, (ptype, start, count) in enumerate(entries, 1):
        if ptype == 0 or count == 0:
            continue
        if ptype in EXTENDED_TYPES:
            _parse_logical(read, start, table)
            continue
        table.partitions.append(Partition(n, start * SECTOR, count * SECTOR, "mbr", f"0x{ptype:02x}"))
    table.partitions.sort(key=lambda p: p.number)
    return table


def _parse_logical(read: Callable[[int, int], bytes], ext_start: int, table: PartitionTable) -> None:
    ebr_lba = ext_start
    number = 5
    seen: set[int] = set()
    while ebr_lba and number < 5 + MAX_LOGICAL:
        if ebr_lba in seen:
            table.notes.append(f"extended partition chain loops at sector {ebr_lba}")
            return
        seen.add(ebr_lba)
        ebr = read(ebr_lba * SECTOR, SECTOR)
        if len(ebr) < SECTOR or ebr[510:512] != b"\x55\xaa":
            table.notes.append(f"no EBR signature at sector {ebr_lba}")
            return
        (t1, s1, c1), (t2, s2, _c2) = _mbr_entries(ebr)[:2]
        if t1 and c1:
            table.partitions.append(Partition(number, (ebr_lba + s1) * SECTOR, c1 * SECTOR, "mbr", f"0x{t1:02x}"))
            number += 1
        ebr_lba = ext_start + s2 if t2 in EXTENDED_TYPES and s2 else 0


def _parse_gpt(read: Callable[[int, int], bytes], disk_size: int | None) -> PartitionTable | None:
    hdr = read(SECTOR, SECTOR)
    if hdr[:8] != b"EFI PART":
        return None
    entries_lba, num, esize = struct.unpack("<QII", hdr[72:88])
    table = PartitionTable("gpt")
    if esize < 128 or num == 0:
        table.notes.append(f"GPT header lists {num} entries of {esize} bytes")
        return table
    total = min(num * esize, MAX_GPT_ENTRIES_BYTES)
    raw = read(entries_lba * SECTOR, total)
    for i in range(total // esize):
        e = raw[i * esize : (i + 1) * esize]
        if e[:16] == b"\0" * 16:
            continue
        first, last = struct.unpack("<QQ", e[32:48])
        if last < first:
            table.notes.append(f"GPT entry {i + 1} ends before it starts")
            continue
        guid = _gpt_guid(e[:16])
        name = e[56:128].decode("utf-16-le", "replace").split("\0", 1)[0]
        table.partitions.append(
            Partition(i + 1, first * SECTOR, (last - first + 1) * SECTOR, "gpt", GPT_TYPES.get(guid, guid), name)
        )
    return table
