"""Helpers for the reliability tests."""

from __future__ import annotations

from pathlib import Path


def fill(directory: Path) -> None:
    """Fill the file system of ``directory`` to the last byte."""
    import os

    for name, chunk in (("filler", 65536), ("filler2", 512), ("filler3", 1)):
        fd = os.open(directory / name, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, b"\0" * chunk)
        except OSError:
            pass
        finally:
            os.close(fd)
