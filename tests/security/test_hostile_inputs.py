"""Issue 20 items 3, 5, 6, 10 and issue 19's odd inputs: FIFOs, devices, huge files, link loops, unreadable
directories, processes that only call themselves QEMU, and control characters aimed at root's terminal."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvmtune.cli import main
from kvmtune.host.root import HostRoot
from kvmtune.qemu.image import ImageError, read_image
from kvmtune.qemu.process import running_qemu_guests
from kvmtune.runner import Runner
from kvmtune.textsafe import safe, safe_block

ESC = "\x1b"
DOMAIN = """<domain type='kvm'>
  <name>{name}</name>
  <memory unit='GiB'>1</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='q35'>hvm</type></os>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='none'/>
      <source file='{source}'/>
      <target dev='vda' bus='virtio'/>
    </disk>
  </devices>
</domain>
"""


def audit(args: list[str], capsys: pytest.CaptureFixture[str], timeout: float = 10.0) -> tuple[int, str, str, float]:
    t0 = time.monotonic()
    code = main(["audit", *args])
    took = time.monotonic() - t0
    out = capsys.readouterr()
    assert took < timeout, f"audit took {took:.1f} s"
    return code, out.out, out.err, took


def test_fifo_arguments_are_refused_unopened(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "guest.xml"
    os.mkfifo(fifo)
    cmd_fifo = tmp_path / "qemu.args"
    os.mkfifo(cmd_fifo)
    img_fifo = tmp_path / "disk.qcow2"
    os.mkfifo(img_fifo)
    code, _, err, _ = audit([str(fifo), "--qemu-cmdline", str(cmd_fifo), "--images", str(img_fifo)], capsys)
    assert code == 2
    assert f"{fifo}: not a regular file (a FIFO); not opened" in err
    assert f"{cmd_fifo}: not a regular file (a FIFO); not opened" in err
    assert f"{img_fifo}: not a regular file or block device (a FIFO); not opened" in err


def test_dev_zero_says_not_a_regular_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err, _ = audit(["/dev/zero", "--qemu-cmdline", "/dev/zero"], capsys)
    assert code == 2
    assert err.count("/dev/zero: not a regular file (a character device); not opened") == 2
    assert "larger than" not in err


def test_huge_command_line_file_is_refused_with_bounded_memory(tmp_path: Path) -> None:
    big = tmp_path / "huge.args"
    with open(big, "wb") as fh:
        fh.truncate(3 * 1024**3)  # sparse: 3 GiB of zeros, no disk used
    # VmHWM is this process's own peak; getrusage's ru_maxrss would also carry the parent's (pytest's) RSS
    # from before the exec, which Linux keeps in the child's maximum
    code = (
        "import sys\n"
        "from kvmtune.cli import main\n"
        f"rc = main(['audit', '--qemu-cmdline', {str(big)!r}])\n"
        "hwm = next(line for line in open('/proc/self/status') if line.startswith('VmHWM:')).split()[1]\n"
        "print(hwm, rc, file=sys.stderr)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    rss_kib, rc = res.stderr.strip().splitlines()[-1].split()
    assert rc == "2" and "huge.args: larger than 4 MiB, refused" in res.stderr
    assert int(rss_kib) < 300 * 1024, f"peak RSS {int(rss_kib) // 1024} MiB"


def test_directory_walk_reports_fifos_loops_and_unreadable_dirs(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "domains"
    (d / "sub").mkdir(parents=True)
    (d / "ok.xml").write_text(DOMAIN.format(name="ok", source="/nonexistent.raw"))
    os.mkfifo(d / "sub" / "stuck.xml")
    (d / "sub" / "loop").symlink_to(d)  # a link back up: walking it would never end
    (d / "self.xml").symlink_to(d / "self.xml")  # ELOOP
    code, out, err, _ = audit([str(d)], capsys)
    assert f"{d / 'sub' / 'stuck.xml'}: not a regular file (a FIFO); not opened" in err
    assert f"{d / 'sub' / 'loop'}: symbolic link loop" in err
    assert f"{d / 'self.xml'}: symbolic link loop; not followed" in err
    assert code == 2 and "1 of 1 domain XML file(s)" in out


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_unreadable_directory_as_nobody(tmp_path: Path) -> None:
    d = Path(os.environ.get("TMPDIR", "/tmp")) / f"kvmtune-sec-{os.getpid()}"
    try:
        (d / "closed").mkdir(parents=True)
        (d / "ok.xml").write_text(DOMAIN.format(name="ok", source="/nonexistent.raw"))
        (d / "closed" / "hidden.xml").write_text(DOMAIN.format(name="hidden", source="/x.raw"))
        os.chmod(d, 0o755)
        os.chmod(d / "ok.xml", 0o644)
        os.chmod(d / "closed", 0o700)
        res = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", sys.executable, "-m", "kvmtune",
             "audit", str(d)],
            capture_output=True, text=True, timeout=60, env={**os.environ, "HOME": "/"},
        )
        assert f"{d / 'closed'}: cannot list the directory (Permission denied); skipped" in res.stderr
        assert res.returncode == 2
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_fifo_disk_source_costs_no_time_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifos = []
    for i in range(3):
        f = tmp_path / f"disk{i}.raw"
        os.mkfifo(f)
        fifos.append(f)
    xmls = []
    for i, f in enumerate(fifos):
        x = tmp_path / f"g{i}.xml"
        x.write_text(DOMAIN.format(name=f"g{i}", source=f))
        xmls.append(str(x))
    _, _, err, _ = audit(xmls, capsys, timeout=5.0)
    assert "not opened" not in err  # domain files are not known to run here: their disks are not probed
    _, _, err, _ = audit(["--assume-this-host", *xmls], capsys, timeout=5.0)
    for f in fifos:
        assert f"{f}: not a regular file or block device (a FIFO); not opened" in err


@pytest.fixture
def fake_qemu(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A python process that calls itself qemu-system-x86_64 and names a FIFO and a root-only file as disks."""
    fifo = tmp_path / "trap.raw"
    os.mkfifo(fifo)
    secret = tmp_path / "secret.raw"
    secret.write_bytes(b"\0" * 4096)
    os.chmod(secret, 0o600)
    argv = ["qemu-system-x86_64", "-c", "import time; time.sleep(60)", "-name", "guest=trap",
            "-drive", f"file={fifo},format=raw,if=virtio", "-drive", f"file={secret},format=raw,if=virtio"]
    proc = subprocess.Popen(argv, executable=sys.executable)
    try:
        deadline = time.monotonic() + 10
        while b"trap.raw" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
        yield proc, fifo
    finally:
        proc.kill()
        proc.wait()


def test_a_process_named_qemu_is_not_trusted(fake_qemu: tuple[subprocess.Popen[bytes], Path],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    proc, fifo = fake_qemu
    assert Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"qemu-system-x86_64\0")
    guests, _ = running_qemu_guests(HostRoot("/"))
    assert all(g.origin != f"/proc/{proc.pid}/cmdline" for g in guests)
    _, out, err, _ = audit(["--running", "--format", "json"], capsys, timeout=20.0)
    assert "trap" not in out and str(fifo) not in out + err


def test_images_of_a_process_are_read_with_its_owner_privileges(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv")
    secret = tmp_path / "root-only.raw"
    secret.write_bytes(b"\0" * 65536)
    os.chmod(secret, 0o600)
    runner = Runner()
    with pytest.raises(ImageError, match="permission denied"):
        read_image(str(secret), runner, [], declared_format="raw", owner=(65534, 65534))
    assert runner.history[0].argv[:3] == ("setpriv", "--reuid=65534", "--regid=65534")
    assert read_image(str(secret), Runner(), [], declared_format="raw").format == "raw"  # root itself may


def test_terminal_control_characters_are_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    evil = f"web{ESC}]0;owned{chr(7)}{ESC}[2J\n0 findings\r\u202e"
    args = tmp_path / f"name{ESC}[31m.args"
    args.write_text(f"qemu-system-x86_64 -name {shlex.quote(evil)} -m 1024 -drive file=/x.raw,if=ide,cache=writethrough\n")
    xml = tmp_path / "dom.xml"
    xml.write_text(DOMAIN.format(name="db&#10;0 findings&#x202e;", source="/nonexistent.raw"))
    missing = tmp_path / f"gone{ESC}]2;x{chr(7)}.xml"
    _, out, err, _ = audit(["--qemu-cmdline", str(args), str(xml), str(missing)], capsys)
    for text in (out, err):
        assert ESC not in text and "\r" not in text and "\u202e" not in text and chr(7) not in text
    assert not any(line.strip() == "0 findings" for line in (out + err).splitlines())
    assert "\\x1b]0;owned\\x07" in out
    assert "\\x1b" in err


def test_safe_helpers() -> None:
    assert safe("a\nb\x1b[2J\x9b\u202e") == "a\\x0ab\\x1b[2J\\x9b\\u202e"
    assert safe_block("line1\n\tline2\x1b") == "line1\n\tline2\\x1b"
