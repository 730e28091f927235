"""The maintainer scripts against deb-systemd-helper in a DPKG_ROOT directory (issue 46 item 6): postinst registers
the timers without enabling them, so the links an operator's `systemctl enable` makes are removed by the purge.
The same in a real chroot with systemctl is scripts/deb-proof.sh."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEB = REPO / "packaging" / "deb"
TIMERS = ("kvmtune-audit.timer", "kvmtune-canary.timer", "kvmtune-sample.timer")
UNITS = ("kvmtune-audit.service", "kvmtune-sample.service", "kvmtune-canary.service", "kvmtune-canary-boot.service", *TIMERS)

pytestmark = pytest.mark.skipif(shutil.which("deb-systemd-helper") is None,
                                reason="deb-systemd-helper (init-system-helpers) is not installed")


def maintscript(root: Path, stubs: Path, script: str, *args: str) -> None:
    env = {"PATH": f"{stubs}:/usr/sbin:/usr/bin:/sbin:/bin", "DPKG_ROOT": str(root), "DPKG_MAINTSCRIPT_PACKAGE": "kvmtune",
           "DPKG_MAINTSCRIPT_NAME": script, "HOME": str(root)}
    proc = subprocess.run(["sh", "-e", str(DEB / script), *args], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture
def installed(tmp_path: Path) -> tuple[Path, Path]:
    """A root with the units unpacked (what dpkg does before postinst) and stubs for py3compile and py3clean."""
    root, stubs = tmp_path / "root", tmp_path / "stubs"
    (root / "usr/lib/systemd/system").mkdir(parents=True)
    for unit in UNITS:
        shutil.copy(DEB / unit, root / "usr/lib/systemd/system" / unit)
    stubs.mkdir()
    for tool in ("py3compile", "py3clean"):
        (stubs / tool).write_text("#!/bin/sh\nexit 0\n")
        (stubs / tool).chmod(0o755)
    maintscript(root, stubs, "postinst", "configure", "")
    return root, stubs


def enable_links(root: Path) -> list[str]:
    wants = root / "etc/systemd/system/timers.target.wants"
    return sorted(p.name for p in wants.iterdir()) if wants.is_dir() else []


def helper_state(root: Path) -> list[str]:
    state = root / "var/lib/systemd/deb-systemd-helper-enabled"
    return sorted(str(p.relative_to(state)) for p in state.rglob("*") if "kvmtune" in p.name) if state.is_dir() else []


def test_postinst_registers_the_timers_without_enabling_them(installed: tuple[Path, Path]) -> None:
    root, _ = installed
    assert enable_links(root) == []  # "Neither is enabled by default" (control's Description)
    for unit in (*TIMERS, "kvmtune-canary-boot.service"):
        assert f"{unit}.dsh-also" in helper_state(root)
    assert not (root / "etc/systemd/system/multi-user.target.wants").exists()  # the canary's boot run neither


def test_purge_removes_the_links_of_timers_the_operator_enabled(installed: tuple[Path, Path]) -> None:
    root, stubs = installed
    wants = root / "etc/systemd/system/timers.target.wants"
    wants.mkdir(parents=True)
    for timer in TIMERS:  # what `systemctl enable TIMER` makes, from the units' WantedBy=timers.target
        (wants / timer).symlink_to(f"/usr/lib/systemd/system/{timer}")
    boot = root / "etc/systemd/system/multi-user.target.wants"
    boot.mkdir(parents=True)
    (boot / "kvmtune-canary-boot.service").symlink_to("/usr/lib/systemd/system/kvmtune-canary-boot.service")
    (root / "var/lib/kvmtune").mkdir(parents=True)
    (root / "var/lib/kvmtune/audit.json").write_text("{}")
    maintscript(root, stubs, "prerm", "remove")
    for unit in UNITS:  # dpkg removes the package's files between prerm and postrm
        (root / "usr/lib/systemd/system" / unit).unlink()
    maintscript(root, stubs, "postrm", "remove")
    assert enable_links(root) == list(TIMERS)  # remove keeps the operator's choice, as dh's snippets do
    maintscript(root, stubs, "postrm", "purge")
    assert enable_links(root) == [] and not wants.exists() and not boot.exists()
    assert helper_state(root) == []
    assert not (root / "var/lib/kvmtune").exists()  # the purge's rm honours DPKG_ROOT, never the real /var/lib
    left = [str(p.relative_to(root)) for p in root.rglob("*") if "kvmtune" in p.name]
    assert left == []


def test_an_upgrade_keeps_an_enabled_timer_enabled(installed: tuple[Path, Path]) -> None:
    root, stubs = installed
    wants = root / "etc/systemd/system/timers.target.wants"
    wants.mkdir(parents=True)
    (wants / "kvmtune-audit.timer").symlink_to("/usr/lib/systemd/system/kvmtune-audit.timer")
    maintscript(root, stubs, "postinst", "configure", "0.1.0")
    assert enable_links(root) == ["kvmtune-audit.timer"]
    assert os.readlink(wants / "kvmtune-audit.timer") == "/usr/lib/systemd/system/kvmtune-audit.timer"
