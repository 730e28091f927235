"""A real QEMU process: ``--running`` reads its command line from /proc and audits it."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvmtune.cli import main

pytestmark = pytest.mark.integration


@pytest.fixture
def qemu(tmp_path: Path) -> Iterator[str]:
    binary = shutil.which("qemu-system-x86_64")
    if binary is None:
        pytest.skip("qemu-system-x86_64 not installed")
    image = tmp_path / "disk.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "64M"], check=True)
    name = f"kvmtune-running-{tmp_path.name[-6:]}"
    netns = f"kvmtune-test-{tmp_path.name[-6:]}"
    # The tap lives in a namespace of the test's own, never in the root namespace; -S keeps the
    # guest stopped, so it spends no CPU and sends nothing.
    subprocess.run(["ip", "netns", "add", netns], check=True)
    proc = subprocess.Popen(
        ["ip", "netns", "exec", netns, binary, "-name", f"guest={name}", "-S", "-accel", "tcg", "-nodefaults", "-display", "none",
         "-m", "128", "-smp", "2", "-machine", "pc",
         "-drive", f"file={image},if=none,id=d0,format=qcow2,cache=writethrough",
         "-device", "ide-hd,drive=d0,bus=ide.0",
         "-netdev", "tap,id=n0,ifname=kvmtunetst0,script=no,downscript=no",
         "-device", "e1000,netdev=n0,mac=52:54:00:12:34:56"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        yield name
    finally:
        proc.kill()
        proc.wait(timeout=10)
        subprocess.run(["ip", "netns", "delete", netns], check=False)


def test_running_qemu_is_audited(qemu: str, capsys: pytest.CaptureFixture[str]) -> None:
    import time

    for _ in range(50):  # QEMU needs a moment to create the tap and reach -S
        code = main(["audit", "--running", "--format", "json"])
        doc = json.loads(capsys.readouterr().out)
        mine = [f for f in doc["findings"] if f["target"]["domain"] == qemu]
        if mine:
            break
        time.sleep(0.1)
    assert code == 0
    rules = {f["rule"] for f in mine}
    assert {"KVM-STO-001", "KVM-STO-002"} <= rules
    assert all(f["source"].startswith("/proc/") and f["source"].endswith("/cmdline") for f in mine)
