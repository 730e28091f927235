"""fix --images with real images built by qemu-img in tmp dirs."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.audit.rule import rule_by_id
from kvmtune.cli import main
from kvmtune.runner import Runner

pytestmark = pytest.mark.skipif(shutil.which("qemu-img") is None, reason="qemu-img not installed")


def qemu_img(*args: str) -> str:
    return subprocess.run(["qemu-img", *args], check=True, capture_output=True, text=True).stdout


def qemu_io_write(path: Path, fmt: str, offset: str, length: str, pattern: str) -> None:
    subprocess.run(["qemu-io", "-f", fmt, "-c", f"write -P {pattern} {offset} {length}", str(path)],
                   check=True, capture_output=True)


def unallocated(path: Path, fmt: str) -> int:
    extents = json.loads(qemu_img("map", "--output=json", "-f", fmt, str(path)))
    return sum(e["length"] for e in extents if "offset" not in e)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def qcow2(tmp_path: Path) -> Path:
    p = tmp_path / "guest.qcow2"
    # 512 MiB = one full L2 table of 64 KiB clusters
    qemu_img("create", "-q", "-f", "qcow2", "-o", "preallocation=off,cluster_size=65536", str(p), "512M")
    qemu_io_write(p, "qcow2", "1M", "3M", "0x5a")
    qemu_io_write(p, "qcow2", "300M", "64k", "0xa5")
    return p


@pytest.fixture
def raw(tmp_path: Path) -> Path:
    p = tmp_path / "guest.raw"
    qemu_img("create", "-q", "-f", "raw", str(p), "64M")
    qemu_io_write(p, "raw", "4M", "1M", "0x33")
    return p


def jid_of(out: str) -> str:
    return next(ln for ln in out.splitlines() if ln.startswith("Undo with:")).rsplit(" ", 1)[1]


def test_qcow2_convert_verify_swap_undo(qcow2: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pristine = qcow2.with_name("pristine.qcow2")
    shutil.copyfile(qcow2, pristine)
    digest, ino = sha(qcow2), qcow2.stat().st_ino
    assert unallocated(qcow2, "qcow2") > 0

    assert main(["fix", "--image-format", "qcow2", "--images", str(qcow2)]) == 0
    out = capsys.readouterr().out
    assert "preallocation=metadata" in out and "qemu-img compare" in out
    assert sha(qcow2) == digest

    assert main(["fix", "--image-format", "qcow2", "--images", str(qcow2), "--apply", "--yes"]) == 0
    jid = jid_of(capsys.readouterr().out)
    assert unallocated(qcow2, "qcow2") == 0
    assert subprocess.run(["qemu-img", "compare", str(pristine), str(qcow2)], capture_output=True).returncode == 0
    backup = Path(f"{qcow2}.kvmtune-orig-{jid}")
    assert backup.stat().st_ino == ino and sha(backup) == digest
    assert not list(qcow2.parent.glob(".*kvmtune*")), "no temp image left"

    assert main(["fix", "--image-format", "qcow2", "--images", str(qcow2)]) == 0
    assert "Nothing to change." in capsys.readouterr().out

    assert main(["undo", jid]) == 0
    capsys.readouterr()
    assert sha(qcow2) == digest and qcow2.stat().st_ino == ino
    assert not backup.exists()


def test_image_rules_quiet_after_apply(qcow2: Path, raw: Path, capsys: pytest.CaptureFixture[str]) -> None:
    read_image = pytest.importorskip("kvmtune.qemu.image").read_image
    rules = [r for r in (rule_by_id("KVM-IMG-002"), rule_by_id("KVM-IMG-003")) if r is not None]
    if len(rules) != 2:
        pytest.skip("image rules not present")

    def found() -> set[str]:
        images = [read_image(str(p), Runner(), read_partitions=False) for p in (qcow2, raw)]
        return {f.rule for f in run_rules(AuditContext(), images=images, rules=rules)}

    assert found() == {"KVM-IMG-002", "KVM-IMG-003"}
    assert main(["fix", "--image-format", "qcow2", "--images", str(qcow2), "--apply", "--yes"]) == 0
    assert main(["fix", "--image-format", "raw", "--images", str(raw), "--apply", "--yes"]) == 0
    capsys.readouterr()
    assert found() == set()


def test_raw_sparse_to_falloc(raw: Path, capsys: pytest.CaptureFixture[str]) -> None:
    digest = sha(raw)
    assert raw.stat().st_blocks * 512 < 8 * 2**20
    assert main(["fix", "--image-format", "raw", "--images", str(raw), "--apply", "--yes"]) == 0
    jid = jid_of(capsys.readouterr().out)
    assert raw.stat().st_blocks * 512 >= 64 * 2**20
    assert sha(raw) == digest  # same bytes, now allocated
    assert main(["undo", jid]) == 0
    assert raw.stat().st_blocks * 512 < 8 * 2**20


def test_purge_backups(qcow2: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fix", "--image-format", "qcow2", "--images", str(qcow2), "--apply", "--yes"]) == 0
    jid = jid_of(capsys.readouterr().out)
    assert main(["undo", "--purge-backups", jid]) == 0
    assert "deleted" in capsys.readouterr().out
    assert not list(qcow2.parent.glob("*.kvmtune-orig-*"))
    assert main(["undo", jid]) == 1
    assert "was deleted (--purge-backups)" in capsys.readouterr().err

    qcow2_2 = qcow2.with_name("second.qcow2")
    qemu_img("create", "-q", "-f", "qcow2", str(qcow2_2), "512M")
    assert main(["fix", "--image-format", "qcow2", "--images", str(qcow2_2), "--apply", "--yes", "--purge-backups"]) == 0
    capsys.readouterr()
    assert not list(qcow2.parent.glob("second.qcow2.kvmtune-orig-*"))


def test_overlays_and_other_formats_are_left_alone(qcow2: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    overlay = tmp_path / "overlay.qcow2"
    qemu_img("create", "-q", "-f", "qcow2", "-b", str(qcow2), "-F", "qcow2", str(overlay))
    vdi = tmp_path / "old.vdi"
    qemu_img("create", "-q", "-f", "vdi", str(vdi), "16M")
    assert main(["fix", "--image-format", "qcow2", "--images", str(overlay), str(vdi)]) == 0
    out = capsys.readouterr().out
    assert "has a backing file" in out and f"{vdi}: cannot be opened as the declared qcow2" in out
    assert "Nothing to change." in out


@pytest.fixture
def running_qemu(qcow2: Path) -> Iterator[subprocess.Popen[bytes]]:
    qemu = shutil.which("qemu-system-x86_64")
    if qemu is None:
        pytest.skip("qemu-system-x86_64 not installed")
    proc = subprocess.Popen(
        [qemu, "-nodefaults", "-display", "none", "-machine", "none", "-S",
         "-drive", f"file={qcow2},format=qcow2,if=none,id=d0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if any(os.path.realpath(f"/proc/{proc.pid}/fd/{fd}") == str(qcow2)
               for fd in os.listdir(f"/proc/{proc.pid}/fd")):
            break
        time.sleep(0.05)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.integration
def test_image_open_by_qemu_is_refused(qcow2: Path, running_qemu: subprocess.Popen[bytes],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    digest = sha(qcow2)
    assert main(["fix", "--image-format", "qcow2", "--images", str(qcow2), "--apply", "--yes"]) == 3  # refused: non-zero
    out = capsys.readouterr().out
    assert f"open by pid {running_qemu.pid}" in out and "Nothing changed: 1 image(s) not converted" in out
    # a host root whose /proc shows nothing (a captured tree): QEMU's image lock still refuses it
    empty_root = qcow2.parent / "root"
    empty_root.mkdir()
    assert main(["fix", "--image-format", "qcow2", "--images", str(qcow2), "--apply", "--yes", "--root", str(empty_root)]) == 3
    assert "locked by a running QEMU" in capsys.readouterr().out
    assert sha(qcow2) == digest


def test_a_process_holding_another_hard_link_is_noticed(qcow2: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The open-file check compares (st_dev, st_ino), not path strings: a second name for the file counts."""
    alias = qcow2.with_name("alias.qcow2")
    os.link(qcow2, alias)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; f = open(sys.argv[1], 'rb'); print('open', flush=True); time.sleep(60)",
         str(alias)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        digest = sha(qcow2)
        main(["fix", "--image-format", "qcow2", "--images", str(qcow2), "--apply", "--yes"])
        out = capsys.readouterr().out
        assert f"open by pid {holder.pid}" in out
        assert sha(qcow2) == digest
    finally:
        holder.kill()
        holder.wait()
