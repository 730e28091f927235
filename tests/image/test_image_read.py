"""read_image on real images: format, preallocation detection, chains, partitions, damage."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from kvmtune.qemu.image import ImageError, read_image
from kvmtune.runner import Runner


def read(path: Path, **kw):  # type: ignore[no-untyped-def]
    return read_image(str(path), Runner(), [], **kw)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("prealloc-off.qcow2", "off"),
        ("prealloc-metadata.qcow2", "metadata"),
        ("prealloc-falloc.qcow2", "falloc/full"),
        ("prealloc-full.qcow2", "falloc/full"),
        ("overlay-on-gpt.qcow2", "off (overlay)"),
        ("sparse.raw", "sparse"),
        ("falloc.raw", "full"),
    ],
)
def test_preallocation_detected(images: dict[str, Path], name: str, expected: str) -> None:
    img = read(images[name])
    assert img.preallocation == expected
    assert img.broken is None
    assert "virtual" in img.preallocation_evidence


def test_qemu_img_fields(images: dict[str, Path]) -> None:
    img = read(images["gpt-extl2.qcow2"])
    assert img.format == "qcow2" and img.virtual_size == 64 * 1024 * 1024
    assert img.cluster_size == 128 * 1024 and img.extended_l2 and img.compat == "1.1"
    assert img.partitions is not None and img.partitions.scheme == "gpt"
    assert img.filesystem is not None and img.filesystem.free > 0


def test_backing_chain(images: dict[str, Path]) -> None:
    img = read(images["chain3.qcow2"], declared_format="qcow2")
    assert [Path(p).name for p in img.backing_chain] == ["chain2.qcow2", "chain1.qcow2", "chain0.qcow2"]
    assert read(images["chain3.qcow2"]).backing_chain == []  # probed: the header does not choose files to open


def test_missing_file_is_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(ImageError) as exc:
        read(tmp_path / "nope.qcow2")
    assert str(exc.value) == f"{tmp_path / 'nope.qcow2'}: no such file"


def test_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="is a directory"):
        read(tmp_path)


def test_truncated_qcow2_is_broken_not_a_crash(images: dict[str, Path], scratch_copy) -> None:  # type: ignore[no-untyped-def]
    p = scratch_copy(images["prealloc-off.qcow2"], "trunc.qcow2")
    os.truncate(p, 300)
    img = read(p)
    assert img.broken is not None and "truncated" in img.broken
    assert img.partitions is None


def test_garbled_header_is_broken(images: dict[str, Path], scratch_copy) -> None:  # type: ignore[no-untyped-def]
    p = scratch_copy(images["prealloc-off.qcow2"], "garbled.qcow2")
    with open(p, "r+b") as fh:
        fh.seek(20)
        fh.write(b"\x00\x00\x00\x63")  # cluster_bits = 99
    img = read(p)
    assert img.broken is not None and "qemu-img cannot open it" in img.broken


def test_corrupt_bit(images: dict[str, Path], scratch_copy) -> None:  # type: ignore[no-untyped-def]
    p = scratch_copy(images["prealloc-off.qcow2"], "corrupt.qcow2")
    with open(p, "r+b") as fh:
        fh.seek(79)
        b = fh.read(1)[0]
        fh.seek(79)
        fh.write(bytes([b | 2]))
    img = read(p)
    assert img.corrupt


def test_missing_backing_file(tmp_path: Path) -> None:
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(tmp_path / "gone.qcow2"), "-F", "qcow2",
                    "-u", str(tmp_path / "ov.qcow2"), "64M"], check=True)
    img = read(tmp_path / "ov.qcow2", declared_format="qcow2")
    assert img.backing_error is not None and "gone.qcow2: no such file" in img.backing_error
    assert img.partition_note is not None and "no such file" in img.partition_note


def test_qemu_img_missing_reads_raw_only(images: dict[str, Path], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no qemu-img
    runner = Runner()
    img = read_image(str(images["mbr63.qcow2"]), runner, [])
    assert img.info_source == "stat"
    assert img.format == "qcow2" and img.partitions is None and img.partition_note
    assert "qemu-img is needed" in img.partition_note
    raw = read_image(str(images["mbr63.raw"]), runner, [])
    assert raw.format == "raw" and raw.virtual_size == 64 * 1024 * 1024
    assert raw.partitions is not None and raw.partitions.partitions[0].start_sector == 63
    assert runner.history[0].returncode == 127


def test_own_work_is_fast(images: dict[str, Path]) -> None:
    """Everything except qemu-img itself stays well under 100 ms per image."""
    for name in ("mbr63.qcow2", "gpt-extl2.qcow2", "prealloc-metadata.qcow2", "big-1t.qcow2", "mbr63-compressed.qcow2"):
        runner = Runner()
        t0 = time.perf_counter()
        read_image(str(images[name]), runner, [])
        own = time.perf_counter() - t0 - sum(r.duration_s for r in runner.history)
        assert own < 0.3, (name, own)  # budget 100 ms; slack for loaded CI machines (bench/audit_host measures)


def test_qemu_img_refused_access_is_an_error_not_damage(images: dict[str, Path], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin" / "qemu-img"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho \"qemu-img: Could not open '$4': Permission denied\" >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    with pytest.raises(ImageError) as exc:
        read_image(str(images["sparse.raw"]), Runner(), [])
    assert str(exc.value) == f"{images['sparse.raw']}: qemu-img cannot open it (permission denied)"
