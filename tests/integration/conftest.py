from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def libvirt_uri() -> Iterator[str]:
    """A real libvirtd on qemu:///system, started by the project's own script if needed."""
    libvirt = pytest.importorskip("libvirt")
    proc = subprocess.run(["bash", str(REPO / "scripts" / "services.sh"), "libvirtd-start"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    libvirt.registerErrorHandler(lambda _c, _e: None, None)
    yield "qemu:///system"
