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


def test_no_settings_file_or_another_spelling_of_yes_is_a_no_op(tmp_path: Path) -> None:
    for n, setting in enumerate((None, 'KVMTUNE_CANARY_APT_HOOK="YES"\n', "KVMTUNE_CANARY_APT_HOOK=yes\r\n",
                                 "KVMTUNE_CANARY_APT_HOOK='yes '\n", "# KVMTUNE_CANARY_APT_HOOK=yes\n")):
        root = root_with(tmp_path / str(n), enabled=False)
        if setting is None:
            (root / "etc/default/kvmtune").unlink()
        else:
            (root / "etc/default/kvmtune").write_text(setting)
        hook(root)
        status(root, "1:7.2-2")
        hook(root)
        assert not (root / "var/lib/kvmtune").exists(), setting


def test_the_hook_watches_what_the_canary_environment_watches() -> None:
    """A package whose change the canary would name in ``changed`` arms the boot run; the hook's list is the
    environment's (kvmtune.canary.environment.WATCHED, and every linux-image-*)."""
    from kvmtune.canary.environment import WATCHED

    text = HOOK.read_text()
    listed = set(text.split("^(", 1)[1].split(")$", 1)[0].split("|"))
    assert listed | {w for w in WATCHED if w.startswith("linux-image-")} == set(WATCHED)
    assert "^linux-image-" in text


def test_enabled_each_watched_package_arms_it(tmp_path: Path) -> None:
    from kvmtune.canary.environment import WATCHED

    root = root_with(tmp_path, enabled=True)
    for name in (*WATCHED, "linux-image-6.1.0-57-cloud-amd64"):
        (root / "var/lib/dpkg/status").write_text(STANZA.format(name=name, version="1.0-1"))
        hook(root)
        (root / "var/lib/kvmtune/canary-armed").unlink(missing_ok=True)
        (root / "var/lib/dpkg/status").write_text(STANZA.format(name=name, version="1.0-2"))
        hook(root)
        assert (root / "var/lib/kvmtune/canary-armed").exists(), name
        (root / "var/lib/kvmtune/canary-armed").unlink()
