"""Issue 20 items 4 and 8: ``fix --host --root TREE`` never writes outside TREE through a link inside it, a
capture tree's links and FIFOs are not followed by reads, and ``undo`` gives a file back its mode 000."""

from __future__ import annotations

import hashlib
import os
import shutil
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
