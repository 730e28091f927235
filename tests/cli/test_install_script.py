"""scripts/install.sh --audit-only: what a production hypervisor gets (and does not)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "install.sh"


def test_audit_only_mode_installs_nothing_for_benchmarks() -> None:
    text = SCRIPT.read_text()
    audit_only = next(ln for ln in text.splitlines() if ln.startswith('[ "$mode" = "--audit-only" ] && PACKAGES='))
    for heavy in ("linux-image", "openvswitch", "iperf3", "sockperf", "libvirt-daemon", "qemu-system", "fio"):
        assert heavy not in audit_only


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0, reason="install.sh runs as root")
def test_audit_only_install_runs_the_main_job_under_two_headings(tmp_path: Path) -> None:
    link = tmp_path / "bin" / "kvmtune"
    link.parent.mkdir()
    env = {**os.environ, "KVMTUNE_BIN_LINK": str(link), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.run(["bash", str(SCRIPT), "--audit-only"], capture_output=True, text=True, env=env, timeout=300)
    out = proc.stdout
    assert proc.returncode in (0, 1, 2), proc.stderr  # the host audit's own exit code
    assert os.readlink(link) == str(REPO / ".venv" / "bin" / "kvmtune")
    this_host = out.index("== kvmtune audit: this host")
    examples = out.index("== kvmtune audit --examples: the example domains shipped with kvmtune (not this host)")
    assert this_host < examples
    assert "web01-legacy" not in out[this_host:examples]  # the host's answer is about the host
    assert "web01-legacy" in out[examples:]
    assert "netload" not in out + proc.stderr and "libvirtd" not in out


def test_unknown_install_option_is_refused() -> None:
    proc = subprocess.run(["bash", str(SCRIPT), "--bogus"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "usage:" in proc.stderr


@pytest.mark.parametrize("release", ['ID=ubuntu\nVERSION_CODENAME=noble\n', 'ID=debian\nVERSION_CODENAME=bullseye\n', ""])
def test_an_unknown_release_gets_one_line_naming_what_to_install_and_nothing_is_done(tmp_path: Path, release: str) -> None:
    os_release = tmp_path / "os-release"
    os_release.write_text(release)
    link = tmp_path / "bin" / "kvmtune"
    env = {**os.environ, "KVMTUNE_OS_RELEASE": str(os_release), "KVMTUNE_BIN_LINK": str(link), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(["bash", str(SCRIPT), "--audit-only"], capture_output=True, text=True, env=env, timeout=30)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith("install.sh: ") and "is not Debian 12 (bookworm) or 13 (trixie); nothing installed" in line
    for named in ("libvirt's Python binding", "qemu-img", "kvmtune-*.whl", "kvmtune_*.deb"):
        assert named in line, named
    assert not link.parent.exists()


@pytest.mark.parametrize("codename", ["bookworm", "trixie"])
def test_bookworm_and_trixie_pass_the_release_check(tmp_path: Path, codename: str) -> None:
    """Past the release check a non-root run stops at the root check: the release itself was accepted."""
    readable = Path(tempfile.mkdtemp(prefix="kvmtune-os-release."))  # nobody must read it: not below root's 0700 tmp_path
    readable.chmod(0o755)
    os_release = readable / "os-release"
    os_release.write_text(f"ID=debian\nVERSION_CODENAME={codename}\n")
    os_release.chmod(0o644)
    env = {**os.environ, "KVMTUNE_OS_RELEASE": str(os_release)}
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "bash", str(SCRIPT), "--audit-only"],
                          capture_output=True, text=True, env=env, timeout=30, cwd="/")
    shutil.rmtree(readable)
    assert proc.returncode == 2 and "run as root" in proc.stderr and "is not Debian" not in proc.stderr
