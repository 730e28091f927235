"""The drift canary's apt hook (packaging/deb/canary-apt-hook): a no-op unless the operator enables it; enabled, it
arms kvmtune-canary-boot.service when a watched package's version changed, and only then."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HOOK = REPO / "packaging" / "deb" / "canary-apt-hook"
STANZA = "Package: {name}\nStatus: install ok installed\nArchitecture: amd64\nVersion: {version}\n\n"

pytestmark = pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="dpkg-query is not installed")


def root_with(tmp_path: Path, enabled: bool) -> Path:
    root = tmp_path / "root"
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "etc/default").mkdir(parents=True)
    (root / "etc/default/kvmtune").write_text(f'KVMTUNE_CANARY_APT_HOOK="{"yes" if enabled else "no"}"\n')
    status(root, "1:7.2-1")
    return root


def status(root: Path, qemu: str) -> None:
    (root / "var/lib/dpkg/status").write_text(STANZA.format(name="qemu-system-x86", version=qemu)
                                              + STANZA.format(name="vim", version="2:9.0"))


def hook(root: Path) -> None:
    res = subprocess.run(["sh", str(HOOK)], env={"PATH": "/usr/bin:/bin", "DPKG_ROOT": str(root)}, capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 0, res.stderr


def test_the_hook_is_a_no_op_unless_enabled(tmp_path: Path) -> None:
    root = root_with(tmp_path, enabled=False)
    hook(root)
    status(root, "1:7.2-2")
    hook(root)
    assert not (root / "var/lib/kvmtune").exists()


def test_enabled_it_arms_the_boot_run_on_a_watched_change_only(tmp_path: Path) -> None:
    root = root_with(tmp_path, enabled=True)
    hook(root)  # the first note: nothing to compare with
    assert (root / "var/lib/kvmtune/canary-packages").read_text() == "qemu-system-x86 1:7.2-1\n"
    assert not (root / "var/lib/kvmtune/canary-armed").exists()
    (root / "var/lib/dpkg/status").write_text((root / "var/lib/dpkg/status").read_text().replace("2:9.0", "2:9.1"))
    hook(root)  # vim is not watched
    assert not (root / "var/lib/kvmtune/canary-armed").exists()
    status(root, "1:7.2-2")
    hook(root)
    assert (root / "var/lib/kvmtune/canary-armed").exists()
    assert (root / "var/lib/kvmtune/canary-packages").read_text() == "qemu-system-x86 1:7.2-2\n"
