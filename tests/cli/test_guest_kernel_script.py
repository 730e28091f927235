"""scripts/guest-kernel.sh: a generic Debian kernel for the probe guest, in kvmtune's cache, never in /boot."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "guest-kernel.sh"
INSTALL = REPO / "scripts" / "install.sh"


def _stub(bindir: Path, name: str, body: str) -> None:
    path = bindir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def _env(tmp_path: Path, boot: Path, stubs: Path | None = None) -> dict[str, str]:
    path = f"{stubs}:{os.environ['PATH']}" if stubs else os.environ["PATH"]
    return {**os.environ, "KVMTUNE_GUEST_KERNEL_CACHE": str(tmp_path / "cache"), "KVMTUNE_BOOT_DIR": str(boot), "PATH": path}


def test_install_deps_only_calls_it_and_audit_only_does_not() -> None:
    text = INSTALL.read_text()
    call = text.index("bash scripts/guest-kernel.sh")
    assert text.index('if [ "$mode" = "--audit-only" ]; then\n  echo "install.sh: audit-only install done.') < call
    # a failure (offline) does not stop the install
    line = next(ln for ln in text.splitlines() if ln.startswith("bash scripts/guest-kernel.sh"))
    assert "||" in line


def test_offline_apt_is_one_line_exit_3_and_nothing_is_made(tmp_path: Path) -> None:
    boot = tmp_path / "boot"
    boot.mkdir()
    (boot / "vmlinuz-6.1.0-56-cloud-amd64").write_bytes(b"x")
    stubs = tmp_path / "bin"
    stubs.mkdir()
    _stub(stubs, "apt-cache", "exit 100")  # apt knows nothing (no lists: offline, never updated)
    _stub(stubs, "apt-get", "echo 'E: Failed to fetch' >&2; exit 100")
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=_env(tmp_path, boot, stubs), timeout=60)
    assert proc.returncode == 3, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("guest-kernel.sh: apt knows no generic kernel package")
    assert "linux-image-6.1.0-56-amd64" in line and "keeps" in line
    assert not (tmp_path / "cache").exists()


def test_a_failed_download_leaves_no_partial_directory(tmp_path: Path) -> None:
    boot = tmp_path / "boot"
    boot.mkdir()
    stubs = tmp_path / "bin"
    stubs.mkdir()
    _stub(stubs, "apt-get", "echo 'E: Failed to fetch http://deb.debian.org/x' >&2; exit 100")
    proc = subprocess.run(["bash", str(SCRIPT), "--package", "linux-image-6.1.0-99-amd64"], capture_output=True, text=True,
                          env=_env(tmp_path, boot, stubs), timeout=60)
    assert proc.returncode == 3
    (line,) = proc.stderr.splitlines()
    assert "apt-get download linux-image-6.1.0-99-amd64 failed (E: Failed to fetch" in line
    assert list((tmp_path / "cache").iterdir()) == []


def test_an_unpacked_release_is_left_as_it_is(tmp_path: Path) -> None:
    release = "6.1.0-56-amd64"
    dest = tmp_path / "cache" / release
    (dest / "boot").mkdir(parents=True)
    (dest / "boot" / f"vmlinuz-{release}").write_bytes(b"kernel")
    (dest / "lib" / "modules" / release).mkdir(parents=True)
    (dest / "lib" / "modules" / release / "modules.dep").write_text("")
    stubs = tmp_path / "bin"
    stubs.mkdir()
    _stub(stubs, "apt-get", "echo called >&2; exit 1")  # must not be asked
    proc = subprocess.run(["bash", str(SCRIPT), "--package", f"linux-image-{release}"], capture_output=True, text=True,
                          env=_env(tmp_path, tmp_path, stubs), timeout=60)
    assert proc.returncode == 0 and proc.stderr == ""
    assert "already" in proc.stdout
    assert (dest / "boot" / f"vmlinuz-{release}").read_bytes() == b"kernel"


def test_not_a_kernel_package_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", str(SCRIPT), "--package", "openssh-server"], capture_output=True, text=True,
                          env=_env(tmp_path, tmp_path), timeout=60)
    assert proc.returncode == 2 and "not a linux-image-* package" in proc.stderr


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("apt-get") is None, reason="not a Debian host")
def test_it_fetches_the_generic_flavour_with_the_drivers_the_cloud_kernel_lacks(tmp_path: Path) -> None:
    """The real archive: the generic kernel of /boot's ABI (or linux-image-amd64's), unpacked, depmod'ed, e1000 in it."""
    boot_before = sorted(os.listdir("/boot"))
    env = {**os.environ, "KVMTUNE_GUEST_KERNEL_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode == 3:
        pytest.skip(f"apt cannot fetch a kernel here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    (release_dir,) = (tmp_path / "cache").iterdir()
    release = release_dir.name
    assert not release.endswith("-cloud-amd64")
    assert (release_dir / "boot" / f"vmlinuz-{release}").is_file()
    dep = (release_dir / "lib" / "modules" / release / "modules.dep").read_text()
    for driver in ("e1000.ko", "8139too.ko", "8139cp.ko", "virtio_net.ko", "/ahci.ko"):
        assert driver in dep, driver
    assert "drivers/gpu/" not in dep
    assert sorted(os.listdir("/boot")) == boot_before
    again = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 0 and "already" in again.stdout
