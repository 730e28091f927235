from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """Mount small tmpfs file systems (root only) under tmp_path; unmounted afterwards."""
    mounted: list[Path] = []

    def make(size: str) -> Path:
        point = tmp_path / f"tmpfs{len(mounted)}"
        point.mkdir()
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(point)],
                             capture_output=True, text=True, check=False)
        if res.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
        mounted.append(point)
        return point

    yield make
    for point in reversed(mounted):
        subprocess.run(["umount", "--lazy", str(point)], check=False)
