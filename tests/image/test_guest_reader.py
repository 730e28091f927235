"""Guest bytes read through qemu-img (pinned driver, declared format) equal the raw image the qcow2 was made from."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kvmtune.qemu.image import guest_reader, probe_magic, read_image
from kvmtune.runner import Runner

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
    reader = guest_reader(str(images[image]), "qcow2")
    assert reader.size == 64 * MIB
    for off, length in OFFSETS:
        assert reader.read(off, length) == raw_bytes(images[source], off, length), (image, off)


def test_header_fields_from_qemu_img(images: dict[str, Path]) -> None:
    h = read_image(str(images["gpt-extl2.qcow2"]), Runner(), declared_format="qcow2")
    assert h.extended_l2 and h.cluster_size == 128 * 1024 and h.compat == "1.1"
    v2 = read_image(str(images["mbr2048-v2.qcow2"]), Runner(), declared_format="qcow2")
    assert v2.compat == "0.10"
    ov = read_image(str(images["overlay-on-gpt.qcow2"]), Runner(), declared_format="qcow2")
    assert ov.backing_file and ov.backing_file.endswith("gpt.qcow2") and ov.backing_format == "qcow2"
    assert ov.backing_chain == [str(images["gpt.qcow2"])]


def test_probed_format_is_reported_not_trusted(images: dict[str, Path]) -> None:
    assert read_image(str(images["gpt.qcow2"]), Runner()).format == "qcow2"
    assert read_image(str(images["sparse.raw"]), Runner()).format == "raw"
    assert read_image(str(images["foreign.vmdk"]), Runner()).format == "vmdk"
    ov = read_image(str(images["overlay-on-gpt.qcow2"]), Runner())
    assert ov.format_probed and ov.backing_chain == [] and ov.backing_note and "not followed" in ov.backing_note
    assert ov.partitions is None


def test_magic_fallback() -> None:
    assert probe_magic(b"QFI\xfb\x00\x00\x00\x03") == "qcow2"
    assert probe_magic(b"KDMV") == "vmdk"
    assert probe_magic(b"\0" * 16) == "raw"


def test_truncated_is_an_oserror_naming_the_file(images: dict[str, Path], scratch_copy) -> None:  # type: ignore[no-untyped-def]
    p = scratch_copy(images["mbr63.qcow2"], "cut.qcow2")
    with open(p, "r+b") as fh:
        fh.truncate(300_000)
    with pytest.raises(OSError, match="truncated"):
        guest_reader(str(p), "qcow2")


def test_missing_backing_file(tmp_path: Path) -> None:
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(tmp_path / "gone.raw"), "-F", "raw", "-u",
                    str(tmp_path / "ov.qcow2"), "64M"], check=True)
    with pytest.raises(OSError, match=r"gone\.raw: no such file"):
        guest_reader(str(tmp_path / "ov.qcow2"), "qcow2")
