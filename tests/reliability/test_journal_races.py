"""fix --apply and undo under concurrency, kills and full file systems (issue 19, journal items)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from reliability_helpers import domain_xml, fill

from kvmtune.cli import main
from kvmtune.fix.files import lock_target
from kvmtune.fix.journal import list_journals

KVMTUNE = [sys.executable, "-m", "kvmtune"]
DOMAIN = domain_xml("race")


def _fix(xml: Path, journal: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*KVMTUNE, "fix", str(xml), "--apply", "--yes", "--journal-dir", str(journal), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_fix_on_a_file_another_fix_holds_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    xml = tmp_path / "d.xml"
    xml.write_text(DOMAIN)
    fd = lock_target(xml)  # the other operator's fix, mid-apply
    try:
        code = main(["fix", str(xml), "--apply", "--yes", "--journal-dir", str(tmp_path / "j2")])
    finally:
        os.close(fd)
    err = capsys.readouterr().err
    assert code == 2 and "another kvmtune fix --apply or undo is changing it now" in err
    assert xml.read_text() == DOMAIN and list_journals(tmp_path / "j2") == []


def test_two_operators_with_their_own_journals_never_lose_a_change(tmp_path: Path) -> None:
    """Reproduction: sudo's default journal beside $KVMTUNE_JOURNAL_DIR; both said "Applied" and one change was lost."""
    expected = None
    for trial in range(4):
        xml = tmp_path / f"d{trial}.xml"
        xml.write_text(DOMAIN)
        procs = [_fix(xml, tmp_path / f"j{trial}-{k}") for k in range(2)]
        outs = [p.communicate(timeout=120) for p in procs]
        applied = [o for o in outs if "Applied" in o[0]]
        assert len(applied) <= 1, outs
        for p, (out, err) in zip(procs, outs, strict=True):
            assert p.returncode == 0 or ("changing it now" in err or "changed since the plan" in err), (out, err)
            assert "Traceback" not in err
        text = xml.read_text()
        expected = expected or text
        assert text == expected and "cache='none'" in text


def test_undo_on_a_full_journal_file_system_restores_first(
    tmp_path: Path, small_tmpfs: Callable[[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    journal = small_tmpfs("256k")
    xml = tmp_path / "d.xml"
    xml.write_text(DOMAIN)
    assert main(["fix", str(xml), "--apply", "--yes", "--journal-dir", str(journal)]) == 0
    (jid,) = [j for j, _, _ in list_journals(journal)]
    capsys.readouterr()
    fill(journal)
    code = main(["undo", jid, "--yes", "--journal-dir", str(journal)])
    _out, err = capsys.readouterr()
    assert xml.read_text() == DOMAIN, "undo restored nothing"
    assert code == 1 and "could not be updated" in err and "No space left" in err
    assert "Traceback" not in err
    for f in ("filler", "filler2", "filler3"):
        (journal / f).unlink()
    assert main(["undo", jid, "--yes", "--journal-dir", str(journal)]) == 0
    assert "already as before" in capsys.readouterr().out


def test_a_killed_journal_write_leaves_no_temp_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    journal = tmp_path / "j"
    journal.mkdir()
    stray = journal / ".20260101T000000Z-abcdef.json.kvmtune-journal.tmp"  # what a kill mid-save leaves
    stray.write_text('{"prior": "secret contents"}')
    stray.chmod(0o600)
    xml = tmp_path / "d.xml"
    xml.write_text(DOMAIN)
    assert main(["fix", str(xml), "--apply", "--yes", "--journal-dir", str(journal)]) == 0
    assert not stray.exists()
    assert not [p for p in journal.iterdir() if p.name.endswith(".tmp")]


def _sparse_raw(path: Path, size: str = "64M") -> None:
    subprocess.run(["qemu-img", "create", "-q", "-f", "raw", str(path), size], check=True)
    with open(path, "r+b") as fh:
        fh.write(os.urandom(1 << 20))


def test_a_crash_between_backup_link_and_swap_leaves_no_orphan(tmp_path: Path) -> None:
    img, journal = tmp_path / "g.img", tmp_path / "j"
    _sparse_raw(img)
    before = img.read_bytes()
    env = dict(os.environ, KVMTUNE_TEST_KILL_IN_IMAGE_SWAP="1")
    res = subprocess.run([*KVMTUNE, "fix", "--image-format", "raw", "--images", str(img), "--apply", "--yes",
                          "--journal-dir", str(journal)], env=env, capture_output=True, text=True, check=False)
    assert res.returncode == -signal.SIGKILL
    (orig,) = tmp_path.glob("g.img.kvmtune-orig-*")  # the crash left the backup link
    (jid,) = [j for j, _, _ in list_journals(journal)]
    res = subprocess.run([*KVMTUNE, "undo", jid, "--yes", "--journal-dir", str(journal)],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    assert not orig.exists() and img.read_bytes() == before
    assert not list(tmp_path.glob("*.kvmtune-orig-*")) and not list(tmp_path.glob(".*.tmp"))
    # an orphan left by an older kvmtune (journal already "undone"): --purge-backups finds it
    os.link(img, orig)
    res = subprocess.run([*KVMTUNE, "undo", "--purge-backups", jid, "--journal-dir", str(journal)],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 0 and "deleted" in res.stdout, res.stdout + res.stderr
    assert not orig.exists() and img.read_bytes() == before


def _pids_of(argv0: str, mentioning: str) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and cmd and cmd[0].endswith(argv0.encode()) and any(mentioning.encode() in c for c in cmd):
            out.append(int(entry))
    return out


def test_sigkill_during_image_fix_leaves_no_qemu_img_running(tmp_path: Path) -> None:
    img, journal = tmp_path / "big.img", tmp_path / "j"
    _sparse_raw(img, "3G")
    with open(img, "r+b") as fh:  # data to copy, so the conversion takes a moment
        for k in range(1, 200):
            fh.seek(k * (8 << 20))
            fh.write(os.urandom(1 << 20))
    before = (img.stat().st_ino, img.stat().st_size)
    proc = subprocess.Popen([*KVMTUNE, "fix", "--image-format", "raw", "--images", str(img), "--apply", "--yes",
                             "--journal-dir", str(journal)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not _pids_of("qemu-img", str(tmp_path)) or not list(tmp_path.glob(".big.img.kvmtune-*.tmp")):
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.skip("the conversion finished before it could be caught running")
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 2
    while _pids_of("qemu-img", str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.02)
    left = _pids_of("qemu-img", str(tmp_path))
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "qemu-img outlived the SIGKILLed kvmtune by 2 s"
    (jid,) = [j for j, _, _ in list_journals(journal)]
    res = subprocess.run([*KVMTUNE, "undo", jid, "--yes", "--journal-dir", str(journal)],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    assert (img.stat().st_ino, img.stat().st_size) == before
    assert not list(tmp_path.glob(".big.img.kvmtune-*.tmp")) and not list(tmp_path.glob("*.kvmtune-orig-*"))


def test_a_refused_image_fix_exits_non_zero(tmp_path: Path, small_tmpfs: Callable[[str], Path],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    img = tmp_path / "busy.img"
    _sparse_raw(img)
    holder = subprocess.Popen(["sh", "-c", f"exec 3<'{img}'; exec sleep 30"])
    try:
        deadline = time.monotonic() + 10
        while not any(os.path.realpath(f"/proc/{holder.pid}/fd/{fd}") == str(img)
                      for fd in os.listdir(f"/proc/{holder.pid}/fd")):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        code = main(["fix", "--image-format", "raw", "--images", str(img), "--apply", "--yes",
                     "--journal-dir", str(tmp_path / "j")])
    finally:
        holder.kill()
        holder.wait()
    out = capsys.readouterr().out
    assert code == 3 and f"open by pid {holder.pid}" in out and "Nothing changed: 1 image(s) not converted" in out
    small = small_tmpfs("40m")
    tight = small / "tight.img"
    _sparse_raw(tight, "32M")
    code = main(["fix", "--image-format", "raw", "--images", str(tight), "--apply", "--yes",
                 "--journal-dir", str(tmp_path / "j")])
    out = capsys.readouterr().out
    assert code == 3 and "MiB free" in out
    assert sorted(p.name for p in small.iterdir()) == ["tight.img"]  # nothing half-written
