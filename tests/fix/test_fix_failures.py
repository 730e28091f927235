"""Failures in the middle and bad input: nothing half-written, undo of the partial journal restores,
bad input costs one line and exit 2 with nothing changed."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixhelpers import GOLDEN

from kvmtune.cli import main

A = GOLDEN / "KVM-STO-002" / "writethrough.in.xml"
B = GOLDEN / "KVM-SEC-001" / "no-rng.in.xml"


def copies(d: Path) -> tuple[Path, Path]:
    a, b = d / "a.xml", d / "b.xml"
    shutil.copyfile(A, a)
    shutil.copyfile(B, b)
    return a, b


def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


# --------------------------------------------------------------------------- a full filesystem


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0755", "tmpfs", str(mnt)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def fill(mnt: Path, leave_pages: int) -> None:
    """Fill ``mnt`` with 4 KiB files, then free ``leave_pages`` of them."""
    n = 0
    while True:
        try:
            with open(mnt / f"fill{n}", "wb") as fh:
                fh.write(b"x" * 4096)
        except OSError:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(mnt / f"fill{n}")
            break
        n += 1
    for k in range(leave_pages):
        os.unlink(mnt / f"fill{n - 1 - k}")


def test_full_filesystem_midway(tiny_tmpfs: Path, journal_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = copies(tiny_tmpfs)
    # b grows past one 4 KiB page when fixed; a stays within one: with one page free, a fits and b does not
    b.write_bytes(B.read_bytes().replace(b"  <metadata>\r\n", b"  <metadata>\r\n    <!--" + b"p" * 3000 + b"-->\r\n", 1))
    a0, b0 = a.read_bytes(), b.read_bytes()
    assert len(a0) < 4096 < len(b0) < 8192 - 200
    fill(tiny_tmpfs, leave_pages=1)
    assert main(["fix", "--apply", "--yes", str(a), str(b)]) == 3
    err = capsys.readouterr().err
    assert "No space left on device" in err and "1 of 2 change(s) were made" in err
    assert a.read_bytes() != a0  # the first change was made
    assert b.read_bytes() == b0  # the second was not, and not half-written
    assert not [p for p in tiny_tmpfs.iterdir() if ".kvmtune-" in p.name], "no temp file left behind"
    (jfile,) = journal_dir.glob("*.json")
    doc = json.loads(jfile.read_text())
    assert doc["state"] == "failed" and [e["status"] for e in doc["changes"]] == ["done", "failed"]
    assert main(["undo", jfile.stem]) == 0
    assert a.read_bytes() == a0 and b.read_bytes() == b0


def test_journal_cannot_be_written(tmp_path: Path, tiny_tmpfs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, _b = copies(tmp_path)
    a0 = a.read_bytes()
    fill(tiny_tmpfs, leave_pages=0)
    assert main(["fix", "--apply", "--yes", "--journal-dir", str(tiny_tmpfs / "journal"), str(a)]) == 2
    assert "cannot write the journal" in one_line(capsys.readouterr().err)
    assert a.read_bytes() == a0


# --------------------------------------------------------------------------- killed between two changes


def test_killed_between_two_changes(tmp_path: Path, journal_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = copies(tmp_path)
    a0, b0 = a.read_bytes(), b.read_bytes()
    env = dict(os.environ, KVMTUNE_TEST_KILL_AFTER_CHANGE="1", KVMTUNE_JOURNAL_DIR=str(journal_dir))
    proc = subprocess.run([sys.executable, "-m", "kvmtune", "fix", "--apply", "--yes", str(a), str(b)],
                          env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == -9, proc.stderr
    assert a.read_bytes() != a0 and b.read_bytes() == b0
    (jfile,) = journal_dir.glob("*.json")
    doc = json.loads(jfile.read_text())
    assert doc["state"] == "applying" and [e["status"] for e in doc["changes"]] == ["planned", "planned"]
    assert main(["undo", "--list"]) == 0
    assert f"{jfile.stem}  applying" in capsys.readouterr().out
    assert main(["undo", jfile.stem]) == 0
    assert "interrupted while applying" in capsys.readouterr().out
    assert a.read_bytes() == a0 and b.read_bytes() == b0


# --------------------------------------------------------------------------- bad input


def test_unparsable_xml(tmp_path: Path, journal_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, _ = copies(tmp_path)
    bad = tmp_path / "bad.xml"
    bad.write_text("<domain type='kvm'><name>x</name><devices>\n</domain>\n")
    a0 = a.read_bytes()
    assert main(["fix", "--apply", "--yes", str(a), str(bad)]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"kvmtune: {bad}:") and "malformed XML" in line
    assert a.read_bytes() == a0  # all or nothing: the good file is not changed either
    assert list(journal_dir.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["fix", "/nonexistent/vm.xml"], "no such file"),
        (["fix"], "nothing to fix"),
        (["fix", "--domain", "x"], "--domain needs --connect"),
        (["fix", "vm.xml", "--root", "/nonexistent-root"], "not a directory"),
        (["undo"], "give a journal ID"),
        (["undo", "20990101T000000Z-abcdef"], "no journal 20990101T000000Z-abcdef"),
        (["undo", "../../etc/passwd"], "is not a journal id"),
        (["fix", "--connect", "test+unix:///nonexistent/sock"], "cannot connect to libvirt"),
    ],
)
def test_bad_arguments(argv: list[str], needle: str, journal_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusals (--root is checked by its type now)
        code = int(exc.code or 0)
    assert code == 2
    assert needle in one_line(capsys.readouterr().err)
    assert list(journal_dir.iterdir()) == []


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"[]", b'{"kvmtune_journal": 1, "id": "X"}', b"", b"\xff\xfe\x00",
     b'{"kvmtune_journal": 1, "id": "ID", "state": "applied", "root": "/", "changes": [{"kind": "rm -rf"}]}',
     b'{"kvmtune_journal": 1, "id": "ID", "state": "applied", "root": "/", "changes": [{"kind": "file", '
     b'"path": "/etc/x", "temp": "/etc/.x", "status": "done", "prior_b64": "***"}]}',
     b'{"kvmtune_journal": 1, "id": "ID", "state": "applied", "root": "/", "changes": [{"kind": "runtime", '
     b'"path": "/proc/sys/x", "real_path": "/proc/sys/x", "prior": "1", "new": "2", "status": "done", "restore": 5}]}'],
    ids=["garbage", "list", "wrong-id", "empty", "binary", "unknown-kind", "bad-base64", "bad-restore"],
)
def test_corrupt_journal(content: bytes, tmp_path: Path, journal_dir: Path,
                         capsys: pytest.CaptureFixture[str]) -> None:
    a, _ = copies(tmp_path)
    assert main(["fix", "--apply", "--yes", str(a)]) == 0
    capsys.readouterr()
    (jfile,) = journal_dir.glob("*.json")
    changed = a.read_bytes()
    jfile.write_bytes(content.replace(b'"ID"', f'"{jfile.stem}"'.encode()))
    assert main(["undo", jfile.stem]) == 2
    assert "corrupt journal" in one_line(capsys.readouterr().err)
    assert a.read_bytes() == changed
    assert main(["undo", "--list"]) == 0
    assert "corrupt" in capsys.readouterr().out


def test_one_apply_or_undo_at_a_time(tmp_path: Path, journal_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import fcntl

    a, _ = copies(tmp_path)
    a0 = a.read_bytes()
    fd = os.open(journal_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert main(["fix", "--apply", "--yes", str(a)]) == 2
        assert "another kvmtune fix --apply or undo is running" in one_line(capsys.readouterr().err)
        assert a.read_bytes() == a0
    finally:
        os.close(fd)
