"""MBR/GPT reading inside raw and qcow2 images, and virt-alignment-scan's classification."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from kvmtune.qemu.image import guest_reader
from kvmtune.qemu.partitions import (
    alignment_of,
    classify_alignment,
    format_alignment,
    parse_partition_table,
    scan_line,
)


def table_of(path: Path):  # type: ignore[no-untyped-def]
    r = guest_reader(str(path), "qcow2" if path.suffix == ".qcow2" else "raw")
    return parse_partition_table(r.read, r.size)


@pytest.mark.parametrize("name", ["mbr63.raw", "mbr63.qcow2", "mbr63-compressed.qcow2", "overlay-on-mbr63.qcow2"])
def test_mbr_at_sector_63_with_logical_partitions(images: dict[str, Path], name: str) -> None:
    t = table_of(images[name])
    assert t.scheme == "mbr"
    got = [(p.number, p.start_sector, p.type) for p in t.partitions]
    assert got == [(1, 63, "0x83"), (5, 20543, "0x83"), (6, 30000, "0x82")]
    assert [classify_alignment(p.start) for p in t.partitions] == [
        "bad (alignment < 4K)", "bad (alignment < 4K)", "bad (alignment < 64K)"
    ]


@pytest.mark.parametrize("name", ["mbr2048.raw", "mbr2048-v2.qcow2"])
def test_mbr_at_2048_is_aligned(images: dict[str, Path], name: str) -> None:
    t = table_of(images[name])
    assert [(p.start_sector, classify_alignment(p.start)) for p in t.partitions] == [(2048, "ok"), (43008, "ok")]


@pytest.mark.parametrize("name", ["gpt.raw", "gpt.qcow2", "gpt-extl2.qcow2", "overlay-on-gpt.qcow2"])
def test_gpt(images: dict[str, Path], name: str) -> None:
    t = table_of(images[name])
    assert t.scheme == "gpt"
    assert [(p.start_sector, p.type, p.name) for p in t.partitions] == [
        (34, "BIOS boot", ""), (2048, "Linux filesystem", "root"), (43015, "Linux filesystem", "odd")
    ]
    assert not t.partitions[0].carries_io and t.partitions[1].carries_io


def test_blank_disk_has_no_table(images: dict[str, Path]) -> None:
    assert table_of(images["sparse.raw"]).scheme == "none"


def test_alignment_like_virt_alignment_scan() -> None:
    assert alignment_of(32256) == 512 and format_alignment(32256) == "512"
    assert alignment_of(1048576) == 1048576 and format_alignment(1048576) == "1024K"
    assert format_alignment(0) == "-" and classify_alignment(0) == "ok"
    assert classify_alignment(4096) == "bad (alignment < 64K)"
    assert classify_alignment(65536) == "ok"
    # the upstream exit-code quirk (2^10 taken for 4K) does not leak into the verdict: 2 KiB is < 4K
    assert classify_alignment(2048) == "bad (alignment < 4K)"


def test_scan_line_format(images: dict[str, Path]) -> None:
    p = table_of(images["mbr63.raw"]).partitions[0]
    assert scan_line("/dev/sda", p).split() == ["/dev/sda1", "32256", "512", "bad", "(alignment", "<", "4K)"]


def _disk(sectors: dict[int, bytes], size: int = 1 << 20):  # type: ignore[no-untyped-def]
    def read(off: int, length: int) -> bytes:
        out = bytearray(length)
        for lba, data in sectors.items():
            start = lba * 512
            for i, b in enumerate(data):
                if off <= start + i < off + length:
                    out[start + i - off] = b
        return bytes(out)

    return read


def _mbr(entries: list[tuple[int, int, int]]) -> bytes:
    sec = bytearray(512)
    for i, (ptype, start, count) in enumerate(entries):
        e = bytearray(16)
        e[4] = ptype
        e[8:16] = struct.pack("<II", start, count)
        sec[446 + 16 * i : 462 + 16 * i] = e
    sec[510:512] = b"\x55\xaa"
    return bytes(sec)


def test_ebr_loop_is_noted_not_followed_forever() -> None:
    # extended partition at 100: EBR@100 → EBR@150 → EBR@200 → back to EBR@150
    sectors = {
        0: _mbr([(0x05, 100, 1000)]),
        100: _mbr([(0x83, 1, 10), (0x05, 50, 10)]),
        150: _mbr([(0x83, 1, 10), (0x05, 100, 10)]),
        200: _mbr([(0x83, 1, 10), (0x05, 50, 10)]),
    }
    t = parse_partition_table(_disk(sectors))
    assert t.scheme == "mbr" and [p.number for p in t.partitions] == [5, 6, 7]
    assert any("loops" in n for n in t.notes)


def test_garbage_gpt_header_falls_back_to_mbr() -> None:
    t = parse_partition_table(_disk({0: _mbr([(0xEE, 1, 2000)]), 1: b"NOT A GPT"}))
    assert t.scheme == "mbr" and t.partitions[0].type == "0xee"
