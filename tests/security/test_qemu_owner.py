"""Issue 20 item 3 end to end: root's `audit --running` reads a user's QEMU images with that user's privileges."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvmtune.cli import main

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"),
]


@pytest.fixture
def nobody_qemu() -> Iterator[tuple[str, Path, Path]]:
    binary = shutil.which("qemu-system-x86_64")
    if binary is None:
        pytest.skip("qemu-system-x86_64 not installed")
    d = Path(tempfile.mkdtemp(prefix="kvmtune-owner-"))  # pytest's tmp dirs are closed to nobody
    os.chmod(d, 0o755)
    shared, private = d / "shared.raw", d / "private.raw"
    for p in (shared, private):
        subprocess.run(["qemu-img", "create", "-q", "-f", "raw", str(p), "16M"], check=True)
        os.chown(p, 65534, 65534)  # the user's own disks
        os.chmod(p, 0o644)
    name = f"kvmtune-owner-{os.getpid()}"
    proc = subprocess.Popen(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", binary, "-name", f"guest={name}", "-S",
         "-accel", "tcg", "-nodefaults", "-display", "none", "-m", "64", "-machine", "pc",
         "-drive", f"file={shared},if=none,id=d0,format=raw,cache=none",
         "-drive", f"file={private},if=none,id=d1,format=raw,cache=none",
         "-device", "virtio-blk-pci,drive=d0", "-device", "virtio-blk-pci,drive=d1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # QEMU has both images open
            fds = os.listdir(f"/proc/{proc.pid}/fd") if os.path.exists(f"/proc/{proc.pid}/fd") else []
            if sum(1 for fd in fds if "private.raw" in os.path.realpath(f"/proc/{proc.pid}/fd/{fd}")) >= 1:
                break
            time.sleep(0.1)
        # now only root may read private.raw; QEMU keeps the descriptor it opened before
        os.chown(private, 0, 0)
        os.chmod(private, 0o600)
        yield name, shared, private
    finally:
        proc.kill()
        proc.wait(timeout=10)
        shutil.rmtree(d, ignore_errors=True)


def test_images_of_a_users_qemu_are_read_as_that_user(nobody_qemu: tuple[str, Path, Path],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    name, shared, private = nobody_qemu
    main(["audit", "--running", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert any(f["target"]["domain"] == name for f in doc["findings"]), "the QEMU of nobody was audited"
    notes = " ".join(doc["looked_at"])
    assert "not readable by this user (skipped)" in notes and str(private) in notes
    audited = {f["target"]["device"] or "" for f in doc["findings"]}
    assert not any(str(private) in d for d in audited)
    assert any(str(shared) in d for d in audited), "its readable image was audited (as nobody)"


def test_without_the_capabilities_to_take_its_uid_the_images_are_said_not_read(
        nobody_qemu: tuple[str, Path, Path]) -> None:
    """Issue 43 item 7: kvmtune-audit.service's bounding set lacks CAP_SETUID/CAP_SETGID, so the timer's audit cannot
    read a user's QEMU images as that user. It says so, naming them, rather than blaming the images' modes."""
    name, shared, private = nobody_qemu
    src = Path(__file__).resolve().parents[2] / "src"
    done = subprocess.run(
        ["setpriv", "--bounding-set=-setuid,-setgid", "--", sys.executable, "-m", "kvmtune", "audit", "--no-config",
         "--running", "--format", "json"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(src)}, timeout=300, check=False)
    assert done.returncode in (0, 1), done.stderr
    doc = json.loads(done.stdout)
    assert any(f["target"]["domain"] == name for f in doc["findings"]), ("the QEMU of nobody was audited", doc["looked_at"])
    (line,) = [n for n in doc["looked_at"] if "QEMUs run by other users than root not read" in n]
    assert "no CAP_SETUID/CAP_SETGID, as under kvmtune-audit.service" in line
    assert str(shared) in line and str(private) in line
    audited = {f["target"]["device"] or "" for f in doc["findings"]}
    assert not any(str(shared) in d or str(private) in d for d in audited)
