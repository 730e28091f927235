from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


def _can_build_namespaces() -> str | None:
    if os.geteuid() != 0:
        return "needs root to build network namespaces"
    if shutil.which("ip") is None:
        return "iproute2 not installed"
    return None


@pytest.fixture
def netroot() -> None:
    why = _can_build_namespaces()
    if why:
        pytest.skip(why)


@pytest.fixture
def workdir() -> Iterator[Path]:
    # short on purpose: OVS's unix socket paths must fit in 108 bytes
    d = Path(tempfile.mkdtemp(prefix="kvt-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)
