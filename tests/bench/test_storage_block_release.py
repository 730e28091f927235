"""Deleting the block tier's images on a file system mounted with ``discard`` (issue 22's wall-time goal):
their extents are merged first, with metadata only, so freeing them costs few discards; nothing else is
touched."""

from __future__ import annotations

import mmap
import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kvmtune.host.root import HostRoot
from kvmtune.lab.leftovers import sweep
from kvmtune.lab.workdir import OWNER_FILE, coalesce_extents, release_file
from kvmtune.runner import Runner

BLOCK = 4096
pytestmark = pytest.mark.skipif(shutil.which("filefrag") is None, reason="needs filefrag (e2fsprogs)")


def extents(path: Path) -> int:
    """The file's extents as the file system keeps them (``filefrag``'s summary counts physically
    discontiguous runs instead, and a sparse file's blocks are often placed at their logical offsets)."""
    out = subprocess.run(["filefrag", "-v", str(path)], capture_output=True, text=True, check=True).stdout
    return len(re.findall(r"^\s*\d+:\s+\d+\.\.", out, re.MULTILINE))


def randomly_written(path: Path, size: int, blocks: int) -> list[int]:
    """A sparse file with ``blocks`` 4 KiB blocks written at random with O_DIRECT, as a cache=none cell
    leaves a fresh raw image."""
    with open(path, "wb") as f:
        f.truncate(size)
    written = random.Random(22).sample(range(size // BLOCK), blocks)
    buf = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT needs
    buf.write(b"\xa5" * BLOCK)
    fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
    try:
        for block in written:
            os.pwritev(fd, [buf], block * BLOCK)
    finally:
        os.close(fd)
    return written


def test_a_randomly_written_image_is_merged_into_few_extents_and_then_freed(tmp_path: Path) -> None:
    path, size = tmp_path / "img.raw", 1 << 30
    try:
        written = randomly_written(path, size, 3000)
    except OSError as exc:
        pytest.skip(f"no O_DIRECT here ({exc.strerror})")
    before = extents(path)
    assert before > 1000  # one extent per block written at random: one discard each when freed
    if not coalesce_extents(path, punch=False):
        pytest.skip("this file system has no FALLOC_FL_ZERO_RANGE")
    assert extents(path) <= before // 4  # long (unwritten) extents: ten times fewer on this host's ext4
    assert path.stat().st_size == size
    fd = os.open(path, os.O_RDONLY)
    try:
        assert all(os.pread(fd, BLOCK, b * BLOCK) == bytes(BLOCK) for b in written[:50])  # reads as zeros now
    finally:
        os.close(fd)
    assert coalesce_extents(path) and path.stat().st_blocks == 0  # punched: nothing left to discard at unlink
    release_file(path, coalesce=True)
    assert not path.exists()


def test_a_link_or_a_non_file_in_the_work_directory_is_never_zeroed(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.dat"
    foreign.write_bytes(b"not ours" * 512)
    link = tmp_path / "work" / "img-1.raw"
    link.parent.mkdir()
    link.symlink_to(foreign)
    assert coalesce_extents(link) is False  # O_NOFOLLOW: the link is not followed
    release_file(link, coalesce=True)  # the link goes, what it pointed to stays as it was
    assert not link.is_symlink() and foreign.read_bytes() == b"not ours" * 512
    assert coalesce_extents(tmp_path / "work") is False  # a directory
    assert coalesce_extents(tmp_path / "missing.raw") is False


def test_a_killed_runs_images_are_swept_and_a_link_in_its_scratch_leaves_its_target_alone(tmp_path: Path) -> None:
    dead = tmp_path / "work" / "scratch-100"  # a run killed with SIGKILL left its scratch directory behind
    dead.mkdir(parents=True)
    (dead / OWNER_FILE).write_text('{"pid": 999999999, "start": "1", "boot": ""}')
    try:
        randomly_written(dead / "img-1-r0-0.raw", 256 << 20, 500)
    except OSError as exc:
        pytest.skip(f"no O_DIRECT here ({exc.strerror})")
    foreign = tmp_path / "foreign.dat"
    foreign.write_bytes(b"not ours" * 512)
    (dead / "img-1-r0-1.qcow2").symlink_to(foreign)
    report = sweep(Runner(), HostRoot(), tmp_path / "work")
    assert "scratch-100/" in (report.line() or "") and report.problems == []
    assert not dead.exists() and foreign.read_bytes() == b"not ours" * 512
