"""scripts/install.sh --audit-only: what a production hypervisor gets (and does not)."""

from __future__ import annotations

import os
import subprocess
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
