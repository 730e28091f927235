"""Issue 20 items 4 and 8: ``fix --host --root TREE`` never writes outside TREE through a link inside it, a
capture tree's links and FIFOs are not followed by reads, and ``undo`` gives a file back its mode 000."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvmtune.cli import main
from kvmtune.host.root import HostReadError, HostRoot

FIXTURE = Path(__file__).parent.parent / "fixtures" / "hosts" / "rhel6-old"


def tree_digest(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*"))
            if p.is_file()}


@pytest.fixture
def hostile_tree(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of a fixture tree whose proc/sys and etc/sysctl.d are links to a directory outside it
    (standing in for the real /proc/sys and /etc/sysctl.d of a hostile capture)."""
    tree = tmp_path / "tree"
    shutil.copytree(FIXTURE, tree, symlinks=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.move(tree / "proc" / "sys", outside / "proc-sys")
    (tree / "proc" / "sys").symlink_to(outside / "proc-sys")
    (outside / "sysctl.d").mkdir()
    (tree / "etc" / "sysctl.d").symlink_to(outside / "sysctl.d")
    return tree, outside


def test_fix_host_root_never_writes_through_links_out_of_the_tree(hostile_tree: tuple[Path, Path],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    tree, outside = hostile_tree
    before = tree_digest(outside)
    code = main(["fix", "--host", "--root", str(tree), "--apply", "--yes"])
    out = capsys.readouterr()
    assert tree_digest(outside) == before, "a file outside the --root tree changed"
    assert not any((outside / "sysctl.d").iterdir())
    assert "leads out of the host root" in out.out + out.err
    assert code in (0, 2, 3)


def test_reads_of_a_tree_stay_in_the_tree(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True)
    (tmp_path / "shadow").write_text("root:$6$secret\n")
    (tree / "etc" / "shadow").symlink_to(tmp_path / "shadow")
    (tree / "proc").mkdir()
    os.mkfifo(tree / "proc" / "meminfo")
    (tree / "etc" / "hostname").write_text("inside\n")
    host = HostRoot(str(tree))
    with pytest.raises(HostReadError, match="leads out of the host root"):
        host.read_text("/etc/shadow")
    assert host.read_bytes("/etc/shadow") is None
    t0 = time.monotonic()
    with pytest.raises(HostReadError, match="not a regular file"):
        host.read_text("/proc/meminfo")
    assert time.monotonic() - t0 < 1.0
    assert host.read_text("/etc/hostname") == "inside\n"


def test_audit_of_a_hostile_capture_tree_finishes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(FIXTURE, tree, symlinks=True)
    os.unlink(tree / "proc" / "meminfo") if (tree / "proc" / "meminfo").exists() else None
    os.mkfifo(tree / "proc" / "meminfo")
    (tree / "proc" / "cpuinfo").unlink(missing_ok=True)
    (tree / "proc" / "cpuinfo").symlink_to("/proc/cpuinfo")
    t0 = time.monotonic()
    main(["audit", "--root", str(tree), "--host", "--format", "json"])
    capsys.readouterr()
    assert time.monotonic() - t0 < 20


DOMAIN = """<domain type='kvm'>
  <name>mode000</name>
  <memory unit='GiB'>1</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='q35'>hvm</type></os>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='writethrough'/>
      <source file='/var/lib/libvirt/images/x.raw'/>
      <target dev='vda' bus='virtio'/>
    </disk>
  </devices>
</domain>
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="only root reads a mode-000 file")
def test_undo_keeps_mode_000(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    xml = tmp_path / "locked.xml"
    xml.write_text(DOMAIN)
    os.chmod(xml, 0)
    before = xml.read_bytes()
    assert main(["fix", str(xml), "--apply", "--yes"]) == 0
    out = capsys.readouterr().out
    jid = next(ln for ln in out.splitlines() if ln.startswith("Undo with:")).rsplit(" ", 1)[1]
    assert xml.read_bytes() != before
    assert main(["undo", jid, "--yes"]) == 0
    assert xml.read_bytes() == before
    assert (xml.stat().st_mode & 0o7777) == 0


def test_html_report_escapes_accelerator_names(tmp_path: Path) -> None:
    from kvmtune.bench.report import render
    from kvmtune.lab.store import Store

    evil = "<img src=x onerror=alert(1)>"
    with Store(tmp_path / "r.db") as st:
        ids = []
        for accel in ("tcg", evil):
            rid = st.begin_run("storage", {"accel": accel}, {"runtime": 1})
            st.add_cell(rid, "k|w", {"bus": "ide"}, "w", "ok", {"iops": 10.0}, accel=accel)
            st.finish_run(rid, "complete")
            ids.append(rid)
        page = render(st, ids)
    assert evil not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "These runs used different accelerators" in page


def test_a_tree_value_file_of_gigabytes_is_left_alone_not_planned(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A tree's ``/proc/sys/vm/swappiness`` that is 2 GiB (sparse: ``60`` and NULs): the plan took its first 4 MiB as
    the prior value and printed it (a 16 MB line of escapes; 749 MB peak RSS measured), and ``--apply`` read the
    whole file again to check it. A kernel value fits in a page: more is one skipped line, the rest still planned."""
    tree = tmp_path / "tree"
    shutil.copytree(FIXTURE, tree, symlinks=True)
    value = tree / "proc" / "sys" / "vm" / "swappiness"
    value.write_text("60\n")
    os.truncate(value, 2 * 1024**3)
    assert main(["fix", "--host", "--root", str(tree)]) in (0, 3)
    out = capsys.readouterr().out
    assert f"skipped: vm.swappiness: {value} holds more than 4096 bytes, not a kernel value; left alone" in out
    assert "/proc/sys/vm/swappiness:" not in out and "/proc/sys/vm/dirty_ratio: 10 → 40" in out
    assert len(out) < 64 * 1024


@pytest.mark.parametrize("swap", ["fifo", "huge"])
def test_undo_of_a_tree_value_swapped_for_a_fifo_or_a_huge_file_is_one_line(tmp_path: Path, journal_dir: Path,
                                                                            swap: str) -> None:
    """Between ``fix --apply`` and ``undo`` the tree's owner replaces a value file: a FIFO made ``undo`` wait for ever
    (``read_text`` blocks on it), a 1 GiB file was read whole. Now neither is read past a page: the entry is a
    conflict naming it, the other values are restored."""
    tree = tmp_path / "tree"
    shutil.copytree(FIXTURE, tree, symlinks=True)
    assert main(["fix", "--host", "--root", str(tree), "--apply", "--yes"]) == 0
    journal = next(journal_dir.glob("*.json")).stem  # the conftest's KVMTUNE_JOURNAL_DIR, the child's too
    value = tree / "proc" / "sys" / "vm" / "swappiness"
    value.unlink()
    if swap == "fifo":
        os.mkfifo(value)
    else:
        value.write_text("10\n")
        os.truncate(value, 1024**3)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    done = subprocess.run([sys.executable, "-m", "kvmtune", "undo", "--root", str(tree), journal, "--yes"],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        "kvmtune: /proc/sys/vm/swappiness is no value kvmtune reads (not a regular file of at most 4096 bytes), not "
        "the 10 kvmtune wrote; not restored (--force)",
        f"kvmtune: journal {journal}: 1 change(s) not restored"], done.stderr
    assert (tree / "proc" / "sys" / "vm" / "dirty_ratio").read_text() == "10\n"  # the others are put back
