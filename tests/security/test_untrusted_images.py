"""Issue 20, high items: a guest-written image header chooses neither the format kvmtune converts nor a host to
contact. Real qemu-img, real images, and a real NBD listener on a unix socket counting every connection."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvmtune.cli import main

pytestmark = pytest.mark.skipif(shutil.which("qemu-img") is None, reason="qemu-img not installed")
MIB = 1024 * 1024

DOMAIN = """<domain type='kvm'>
  <name>victim</name>
  <memory unit='GiB'>1</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='q35'>hvm</type></os>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='{fmt}' cache='none'/>
      <source file='{path}'/>
      <target dev='vda' bus='virtio'/>
    </disk>
  </devices>
</domain>
"""


def sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(MIB):
            h.update(chunk)
    return h.hexdigest()


def raw_disk_with_qcow2_header(tmp_path: Path, backing: str | None = None, size: int = 64) -> Path:
    """The issue's reproduction: a raw disk with data, whose guest wrote a small qcow2 image over its start."""
    disk = tmp_path / "g.img"
    with open(disk, "wb") as fh:
        fh.truncate(size * MIB)
        fh.seek(40 * MIB)
        fh.write(bytes(range(256)) * 4096 * 4)  # 4 MiB of data the guest owns
    inner = tmp_path / "inner.qcow2"
    argv = ["qemu-img", "create", "-q", "-f", "qcow2"]
    if backing:
        argv += ["-u", "-b", backing, "-F", "raw"]
    subprocess.run([*argv, str(inner), "16M"], check=True)
    with open(disk, "r+b") as fh:
        fh.write(inner.read_bytes())
    inner.unlink()
    return disk


def test_issue_reproduction_raw_disk_with_qcow2_header_is_not_converted(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    disk = raw_disk_with_qcow2_header(tmp_path)
    digest, size = sha(disk), disk.stat().st_size
    assert subprocess.run(["qemu-img", "info", str(disk)], capture_output=True, text=True).stdout.count("qcow2")

    # no declared format: refused (non-zero, issue 19), whatever the header says
    assert main(["fix", "--images", str(disk), "--apply", "--yes"]) == 3
    out = capsys.readouterr().out
    assert "format not declared" in out and "Nothing changed: 1 image(s) not converted" in out
    assert sha(disk) == digest

    # declared raw (the truth): preallocated as raw, every byte kept, the size unchanged
    assert main(["fix", "--image-format", "raw", "--images", str(disk), "--apply", "--yes", "--purge-backups"]) == 0
    out = capsys.readouterr().out
    assert "preallocation=falloc" in out
    assert disk.stat().st_size == size and sha(disk) == digest
    assert disk.stat().st_blocks * 512 >= size

    # declared by a domain definition, the same way libvirt would open it
    (tmp_path / "second").mkdir()
    disk2 = raw_disk_with_qcow2_header(tmp_path / "second")
    xml = tmp_path / "victim.xml"
    xml.write_text(DOMAIN.format(fmt="raw", path=disk2))
    digest2 = sha(disk2)
    assert main(["fix", str(xml), "--images", str(disk2), "--apply", "--yes", "--purge-backups"]) == 0
    out = capsys.readouterr().out
    assert "preallocation=falloc" in out and "qcow2" not in out.split("image ", 1)[1].split("\n", 1)[0]
    assert sha(disk2) == digest2 and disk2.stat().st_size == 64 * MIB


def test_declared_qcow2_over_raw_is_refused_not_converted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    disk = tmp_path / "plain.raw"
    subprocess.run(["qemu-img", "create", "-q", "-f", "raw", str(disk), "16M"], check=True)
    digest = sha(disk)
    assert main(["fix", "--image-format", "qcow2", "--images", str(disk), "--apply", "--yes"]) == 3  # refused (issue 19)
    assert "cannot be opened as the declared qcow2" in capsys.readouterr().out
    assert sha(disk) == digest


class NbdListener:
    """A unix-socket listener standing in for an NBD server: it only counts who connects."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.connections = 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[NbdListener]:
    lst = NbdListener(tmp_path / "nbd.sock")
    try:
        yield lst
    finally:
        lst.close()


def test_listener_sees_qemu_img_following_a_guest_backing_file(tmp_path: Path, listener: NbdListener) -> None:
    """The control: the hazard is real, so the tests below can fail."""
    disk = raw_disk_with_qcow2_header(tmp_path, f"nbd+unix:///exp?socket={listener.path}")
    subprocess.run(["qemu-img", "info", "--backing-chain", str(disk)], capture_output=True)
    assert listener.connections >= 1


def test_audit_never_contacts_a_backing_file_a_guest_wrote(tmp_path: Path, listener: NbdListener,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    disk = raw_disk_with_qcow2_header(tmp_path, f"nbd+unix:///exp?socket={listener.path}")
    # probed (audit --images): reported, chain not followed
    main(["audit", "--images", str(disk)])
    assert "1 image(s) with a backing file not followed" in capsys.readouterr().out
    # declared raw by the definition: read as raw
    xml = tmp_path / "victim.xml"
    xml.write_text(DOMAIN.format(fmt="raw", path=disk))
    main(["audit", str(xml)])
    # declared qcow2 (a host-made overlay on a network disk): a protocol is never opened while auditing
    xml.write_text(DOMAIN.format(fmt="qcow2", path=disk))
    main(["audit", str(xml)])
    main(["fix", "--image-format", "qcow2", "--images", str(disk)])
    capsys.readouterr()
    assert listener.connections == 0


def test_qcow2_data_file_naming_a_socket_is_not_contacted(tmp_path: Path, listener: NbdListener,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "d.raw"
    subprocess.run(["qemu-img", "create", "-q", "-f", "raw", str(data), "16M"], check=True)
    img = tmp_path / "df.qcow2"
    target = f"nbd+unix:///e?socket={listener.path}"
    placeholder = str(tmp_path / ("p" * max(1, len(target) - len(str(tmp_path)) - 1)))
    placeholder = placeholder[: len(target)].ljust(len(target), "p")
    Path(placeholder).write_bytes(b"")
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-o", f"data_file={placeholder}", str(img), "16M"],
                   check=True)
    blob = img.read_bytes().replace(placeholder.encode(), target.encode())
    img.write_bytes(blob)
    main(["audit", "--images", str(img)])
    xml = tmp_path / "victim.xml"
    xml.write_text(DOMAIN.format(fmt="qcow2", path=img))
    main(["audit", str(xml)])
    capsys.readouterr()
    assert listener.connections == 0


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace not installed")
def test_strace_of_a_whole_audit_shows_no_connect_and_no_guest_chosen_open(tmp_path: Path) -> None:
    """The whole process tree of a real `kvmtune audit`, watched by strace: no connect() at all, no open of a
    file the guest named, and only qemu-img (and setpriv) executed."""
    bait = tmp_path / "bait.raw"
    bait.write_bytes(b"\0" * 4096)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    # a unix socket, not an address: were the test ever to fail, it must not send a packet anywhere
    net = raw_disk_with_qcow2_header(tmp_path / "a", f"nbd+unix:///exp?socket={tmp_path / 'nbd.sock'}")
    local = raw_disk_with_qcow2_header(tmp_path / "b", str(bait))
    xml = tmp_path / "victim.xml"
    xml.write_text(DOMAIN.format(fmt="raw", path=local))
    log = tmp_path / "strace.log"
    subprocess.run(
        ["strace", "-f", "-qq", "-e", "trace=connect,openat,open,execve", "-o", str(log),
         sys.executable, "-m", "kvmtune", "audit", str(xml), "--images", str(net), str(local)],
        capture_output=True, text=True, timeout=120,
    )
    calls = log.read_text().splitlines()
    assert calls, "strace recorded nothing"
    assert not [c for c in calls if " connect(" in c], [c for c in calls if " connect(" in c]
    assert not [c for c in calls if str(bait) in c and ("open" in c)]
    execs = [c.split('execve("', 1)[1].split('"', 1)[0] for c in calls if 'execve("' in c and "= -1" not in c]
    assert all(os.path.basename(e) in ("qemu-img", "setpriv", "ldconfig") or e == sys.executable
               or os.path.basename(e).startswith("python") for e in execs), execs
