"""``inputs.read_regular``, which reads every domain XML: whole files of every size up to its limit
(a file fstat sizes is read with one read call, the rest in chunks), nothing larger, nothing
that is not a regular file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvmtune.errors import InputError
from kvmtune.inputs import CHUNK, read_regular


@pytest.mark.parametrize("size", [1, 4096, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17])
def test_a_regular_file_is_read_whole(tmp_path: Path, size: int) -> None:
    data = (bytes(range(251)) * (size // 251 + 1))[:size]
    path = tmp_path / "f"
    path.write_bytes(data)
    assert read_regular(str(path), 4 * CHUNK) == data


def test_an_empty_file_reads_empty(tmp_path: Path) -> None:
    path = tmp_path / "empty"
    path.write_bytes(b"")
    assert read_regular(str(path), 100) == b""


def test_the_limit_itself_is_allowed_one_byte_more_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    assert read_regular(str(path), 100) == b"x" * 100
    with pytest.raises(InputError, match="larger than 99 bytes"):
        read_regular(str(path), 99)


def test_a_fifo_is_refused_without_being_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        read_regular(str(fifo), 100)  # opening a FIFO with no writer would block: it returns at once
