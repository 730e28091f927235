"""kvmtune's own qcow2 reader returns the same guest bytes as the raw image the qcow2 was made from."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from kvmtune.qemu.qcow2 import (
    Qcow2Error,
    open_guest_reader,
    parse_qcow2_header,
    probe_format,
    read_header,
)

MIB = 1024 * 1024
OFFSETS = [(0, 512), (512, 512 * 33), (32256, 8192), (10518016, 4096), (MIB - 100, 300), (60 * MIB, 65536 + 7)]


def raw_bytes(path: Path, offset: int, length: int) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read(length).ljust(length, b"\0")


@pytest.mark.parametrize(
    ("image", "source"),
    [
        ("mbr63.qcow2", "mbr63.raw"),
        ("gpt.qcow2", "gpt.raw"),
        ("mbr63-compressed.qcow2", "mbr63.raw"),
        ("gpt-extl2.qcow2", "gpt.raw"),
        ("mbr2048-v2.qcow2", "mbr2048.raw"),
        ("overlay-on-mbr63.qcow2", "mbr63.raw"),
        ("overlay-on-gpt.qcow2", "gpt.raw"),
    ],
)
def test_guest_bytes_match_source(images: dict[str, Path], image: str, source: str) -> None:
    reader = open_guest_reader(str(images[image]))
    try:
        assert reader.size == 64 * MIB
        for off, length in OFFSETS:
            assert reader.read(off, length) == raw_bytes(images[source], off, length), (image, off)
    finally:
        reader.close()


def test_header_fields(images: dict[str, Path]) -> None:
    h = read_header(str(images["gpt-extl2.qcow2"]))
    assert h.version == 3 and h.extended_l2 and h.cluster_size == 128 * 1024
    assert h.l2_entry_size == 16
    v2 = read_header(str(images["mbr2048-v2.qcow2"]))
    assert v2.version == 2 and v2.compat == "0.10"
    ov = read_header(str(images["overlay-on-gpt.qcow2"]))
    assert ov.backing_file and ov.backing_file.endswith("gpt.qcow2") and ov.backing_format == "qcow2"


def test_probe_format(images: dict[str, Path]) -> None:
    assert probe_format(str(images["gpt.qcow2"])) == "qcow2"
    assert probe_format(str(images["sparse.raw"])) == "raw"
    assert probe_format(str(images["foreign.vmdk"])) == "vmdk"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"QFI\xfb\x00", "at least 72"),
        (b"XXXX" + b"\0" * 100, "no qcow2 magic"),
        (b"QFI\xfb" + struct.pack(">I", 9) + b"\0" * 100, "version 9"),
        (b"QFI\xfb" + struct.pack(">IQII", 3, 0, 0, 40) + b"\0" * 100, "cluster_bits 40"),
    ],
)
def test_bad_headers_raise_one_line(data: bytes, message: str) -> None:
    with pytest.raises(Qcow2Error) as exc:
        parse_qcow2_header(data)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_truncated_l1_is_named(images: dict[str, Path], scratch_copy) -> None:  # type: ignore[no-untyped-def]
    p = scratch_copy(images["mbr63.qcow2"], "cut.qcow2")
    with open(p, "r+b") as fh:
        fh.truncate(300_000)
    reader = open_guest_reader(str(p))
    with pytest.raises(Qcow2Error, match="beyond the end of the file"):
        reader.read(0, 512 * 64)
    reader.close()


def test_missing_backing_file(images: dict[str, Path], tmp_path: Path) -> None:
    import subprocess

    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(tmp_path / "gone.raw"), "-F", "raw", "-u",
                    str(tmp_path / "ov.qcow2"), "64M"], check=True)
    with pytest.raises(Qcow2Error, match="does not exist"):
        open_guest_reader(str(tmp_path / "ov.qcow2"))
