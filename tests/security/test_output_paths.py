"""`-o`/`--html` as root into a path another user can prepare (/tmp): kvmtune itself refuses block devices,
links to anything but a regular file, links and FIFOs another user planted in a sticky directory, and a
FIFO nobody reads (without waiting for one), whatever the fs.protected_* sysctls say; `-`, /dev/stdout,
/dev/fd/N, /dev/null and regular files keep working.

The CLI runs as a real subprocess: the one-line error, the exit status and "no hang" are what is tested."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kvmtune.fix.files import write_output

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="makes device nodes and chowns links: needs root")


def kvmtune(*args: str, cwd: Path, timeout: float = 30, **kw: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run([sys.executable, "-m", "kvmtune", *args], cwd=cwd, env=env, text=True,  # type: ignore[call-overload, no-any-return]
                          timeout=timeout, **kw)


def audit_to(out: str, cwd: Path, **kw: object) -> subprocess.CompletedProcess[str]:
    kw.setdefault("capture_output", True)
    return kvmtune("audit", "--examples", "--format", "json", "-o", out, cwd=cwd, **kw)


def one_error_line(run: subprocess.CompletedProcess[str], path: Path | str, why: str) -> None:
    assert run.returncode == 2, (run.returncode, run.stderr)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and why in lines[0], run.stderr
    assert "Traceback" not in run.stderr


def unused_block_major() -> int:
    """A block major no driver has registered: the node can be made, and opening it would reach nothing."""
    text = Path("/proc/devices").read_text().split("Block devices:")[1]
    used = {int(line.split()[0]) for line in text.splitlines() if line.strip()}
    return next(m for m in range(240, 255) if m not in used)


def sticky_dir(tmp_path: Path) -> Path:
    d = tmp_path / "tmp"
    d.mkdir()
    os.chmod(d, 0o1777)
    return d


def test_a_link_to_a_block_device_is_refused(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    os.mknod(disk, 0o660 | stat.S_IFBLK, os.makedev(unused_block_major(), 200))
    link = tmp_path / "kvmtune-audit.json"
    link.symlink_to(disk)
    one_error_line(audit_to(str(link), tmp_path), link, "block device")
    assert link.is_symlink() and stat.S_ISBLK(os.lstat(disk).st_mode)
    one_error_line(audit_to(str(disk), tmp_path), disk, "block device")  # named directly too
    assert sorted(p.name for p in tmp_path.iterdir()) == ["disk", "kvmtune-audit.json"]  # no temp file left


def test_a_link_to_a_character_device_is_not_followed(tmp_path: Path) -> None:
    null = tmp_path / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    link = tmp_path / "out.json"
    link.symlink_to(null)
    one_error_line(audit_to(str(link), tmp_path), link, "symbolic link to a character device")
    assert link.is_symlink()


def test_another_users_link_in_a_sticky_directory_is_refused(tmp_path: Path) -> None:
    """fs.protected_symlinks' rule, enforced by kvmtune: the link to root's file is neither followed nor replaced."""
    public = sticky_dir(tmp_path)
    victim = tmp_path / "shadow"
    victim.write_text("root's file\n")
    link = public / "kvmtune-audit.json"
    link.symlink_to(victim)
    os.lchown(link, NOBODY, NOBODY)
    one_error_line(audit_to(str(link), tmp_path), link, f"owned by uid {NOBODY} in the sticky directory")
    assert link.is_symlink() and victim.read_text() == "root's file\n"
    assert [p.name for p in public.iterdir()] == ["kvmtune-audit.json"]
    # root's own link there, to a regular file, is replaced by the report as before
    os.lchown(link, 0, 0)
    assert audit_to(str(link), tmp_path).returncode in (0, 1)
    assert not link.is_symlink() and json.loads(link.read_text())["findings"]
    assert victim.read_text() == "root's file\n"


def test_a_fifo_without_reader_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    run = audit_to(str(fifo), tmp_path, timeout=20)  # before: blocked in open() until a reader came
    one_error_line(run, fifo, "FIFO that no process is reading")
    assert time.monotonic() - started < 15 and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_fifo_with_a_reader_gets_the_report(tmp_path: Path) -> None:
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # the reader is there before kvmtune opens it
    got: list[bytes] = []
    done = threading.Event()

    def drain() -> None:  # reads while kvmtune writes (the report is larger than the pipe's buffer)
        while True:
            try:
                chunk = os.read(rfd, 65536)
            except BlockingIOError:
                chunk = b""
            if chunk:
                got.append(chunk)
            elif done.is_set():
                return
            else:
                time.sleep(0.01)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        assert audit_to(str(fifo), tmp_path).returncode in (0, 1)
    finally:
        done.set()
        reader.join(20)
        os.close(rfd)
    assert json.loads(b"".join(got))["findings"]


def test_another_users_fifo_in_a_sticky_directory_is_refused(tmp_path: Path) -> None:
    """Even with a reader (the planter's own, waiting for root's audit), nothing is written."""
    fifo = sticky_dir(tmp_path) / "kvmtune-audit.json"
    os.mkfifo(fifo, 0o666)
    os.chown(fifo, NOBODY, NOBODY)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        one_error_line(audit_to(str(fifo), tmp_path, timeout=20), fifo, f"FIFO owned by uid {NOBODY}")
        assert os.read(rfd, 100) == b""  # no writer ever opened it
    finally:
        os.close(rfd)


def test_a_planted_temp_file_is_not_written_through(tmp_path: Path) -> None:
    """The temp name beside the target is predictable: a FIFO (or another user's file) there is replaced, not opened."""
    public = sticky_dir(tmp_path)
    planted = public / ".report.html.kvmtune-x.tmp"
    os.mkfifo(planted, 0o666)
    os.chown(planted, NOBODY, NOBODY)
    code = ("import sys; from pathlib import Path; from kvmtune.fix.files import write_output\n"
            f"write_output(Path({str(public / 'report.html')!r}), lambda fh: fh.write('page'), tag='x')")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=20)  # before: blocked in open()
    assert (public / "report.html").read_text() == "page" and not os.path.lexists(planted)


def test_stdout_dash_dev_null_and_files_still_work(tmp_path: Path) -> None:
    dash = audit_to("-", tmp_path)  # standard output, not a file named "-"
    assert dash.returncode in (0, 1) and json.loads(dash.stdout)["findings"]
    assert not (tmp_path / "-").exists()
    piped = audit_to("/dev/stdout", tmp_path)
    assert piped.returncode in (0, 1) and json.loads(piped.stdout)["findings"]
    # stdout redirected to a file: written through the descriptor, not by renaming over /dev/fd/1
    with open(tmp_path / "redirected.json", "w") as fh:
        run = audit_to("/dev/fd/1", tmp_path, capture_output=False, stdout=fh, stderr=subprocess.PIPE)
    assert run.returncode in (0, 1), run.stderr
    assert json.loads((tmp_path / "redirected.json").read_text())["findings"]
    assert audit_to("/dev/null", tmp_path).returncode in (0, 1)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert audit_to(str(tmp_path / "plain.json"), tmp_path).returncode in (0, 1)
    assert json.loads((tmp_path / "plain.json").read_text())["findings"]


def test_a_descriptor_kvmtune_does_not_have_is_refused(tmp_path: Path) -> None:
    one_error_line(audit_to("/dev/fd/57", tmp_path), "/dev/fd/57", "does not have open")


def test_write_output_errors_carry_a_reason(tmp_path: Path) -> None:
    """Callers print `PATH: cannot write (STRERROR)`: the refusals set strerror and the path."""
    disk = tmp_path / "disk"
    os.mknod(disk, 0o660 | stat.S_IFBLK, os.makedev(unused_block_major(), 201))
    with pytest.raises(OSError) as exc:
        write_output(disk, lambda fh: fh.write("x"))
    assert exc.value.strerror.startswith("a block device") and exc.value.filename == str(disk)
