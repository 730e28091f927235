"""``kvmtune fix --root TREE`` on a captured Proxmox VE tree: the VM configs edited as ``qm set`` would,
through the journal, and ``undo`` puts back every byte (issue 35 item 4, the file path)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

TREE = Path(__file__).resolve().parent.parent / "fixtures" / "proxmox" / "cluster"
SRC = Path(__file__).resolve().parents[2] / "src"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvmtune", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(SRC)}, check=False)


def _sums(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_file() and "var/lib/kvmtune" not in rel:
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest() + f" {p.stat().st_mode:o}"
    return out


def test_fix_root_edits_pve_configs_and_undo_restores_them_byte_for_byte(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(TREE, tree, symlinks=True)
    before = _sums(tree)
    conf = tree / "etc/pve/nodes/pve1/qemu-server/8006.conf"

    plan = _cli("fix", "--root", str(tree))
    assert plan.returncode == 0, plan.stderr
    assert "-scsi2: nfs-store:8006/vm-8006-disk-2.qcow2,cache=writeback,size=50G" in plan.stdout
    assert "+scsi2: nfs-store:8006/vm-8006-disk-2.qcow2,cache=none,discard=on,iothread=1,size=50G" in plan.stdout
    assert ("qm set 8006 --rng0 source=/dev/urandom --scsi2 "
            "nfs-store:8006/vm-8006-disk-2.qcow2,cache=none,discard=on,iothread=1,size=50G") in plan.stdout
    assert _sums(tree) == before  # a plan changes nothing

    applied = _cli("fix", "--root", str(tree), "--apply", "--yes")
    assert applied.returncode == 0, applied.stderr
    text = conf.read_text()
    assert "scsi2: nfs-store:8006/vm-8006-disk-2.qcow2,cache=none,discard=on,iothread=1,size=50G\n" in text
    assert text.split("[PENDING]")[1] == (TREE / "etc/pve/nodes/pve1/qemu-server/8006.conf").read_text().split(
        "[PENDING]")[1]  # pending changes and snapshots untouched
    audit = json.loads(_cli("audit", "--root", str(tree), "--no-images", "--format", "json").stdout)
    left = {f["rule"] for f in audit["findings"] if f["fix"]["description"].startswith("qm set")}
    # guest-visible: only with --allow-bus-change
    assert left == {"KVM-CPU-001", "KVM-NET-001", "KVM-STO-012", "KVM-STO-001"}

    undo = next(line for line in applied.stdout.splitlines() if line.startswith("Undo with: "))
    undone = _cli(*undo.removeprefix("Undo with: kvmtune ").split(), "--yes")
    assert undone.returncode == 0, undone.stderr
    assert _sums(tree) == before


def test_fix_root_moves_an_emulated_disk_to_virtio_keeping_its_volume_and_boot_place(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(TREE, tree, symlinks=True)
    before = _sums(tree)
    confs = tree / "etc/pve/nodes/pve1/qemu-server"

    plan = _cli("fix", "--root", str(tree), "--only", "KVM-STO-001")
    assert plan.returncode == 0, plan.stderr
    assert "KVM-STO-001 changes what the guest sees (--allow-bus-change)" in plan.stdout
    assert _sums(tree) == before

    applied = _cli("fix", "--root", str(tree), "--only", "KVM-STO-001", "--allow-bus-change", "--apply", "--yes")
    assert applied.returncode == 0, applied.stderr
    win = (confs / "101.conf").read_text()
    assert "sata0:" not in win and "unused" not in win
    assert "virtio1: local-zfs:vm-101-disk-1,cache=writeback,discard=on,size=64G\n" in win  # the same volume
    assert "boot: order=virtio1;ide0\n" in win  # it stays the disk the VM boots from
    assert "virtio0: cifs-store:101/vm-101-disk-2.qcow2,cache=writethrough,size=40G\n" in win  # the other disk kept
    db = (confs / "102.conf").read_text()
    assert "ide0:" not in db and "virtio2: san-lvm:vm-102-disk-3,size=8G\n" in db and "boot" not in db
    assert "viostor" in applied.stdout and "stop VM 101 first" in applied.stdout
    assert "qm set 101 --virtio1 local-zfs:vm-101-disk-1,cache=writeback,discard=on,size=64G --boot " in applied.stdout
    audit = json.loads(_cli("audit", "--root", str(tree), "--no-images", "--format", "json").stdout)
    assert not [f for f in audit["findings"] if f["rule"] == "KVM-STO-001"]

    undo = next(line for line in applied.stdout.splitlines() if line.startswith("Undo with: "))
    undone = _cli(*undo.removeprefix("Undo with: kvmtune ").split(), "--yes")
    assert undone.returncode == 0, undone.stderr
    assert _sums(tree) == before


def test_fix_root_leaves_a_host_device_drive_alone_unless_named(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(TREE, tree, symlinks=True)
    conf = tree / "etc/pve/nodes/pve1/qemu-server/102.conf"
    conf.write_text(conf.read_text() + "scsi3: /dev/disk/by-id/ata-HOST,cache=writeback,size=100G\n")
    plan = _cli("fix", "--root", str(tree))
    assert plan.returncode == 0, plan.stderr
    assert ("skipped: pve:102 (db) disk:scsi3: KVM-STO-005: scsi3 is the host's /dev/disk/by-id/ata-HOST (a path or "
            "device, not a storage volume): changed only when named (--pve-volume /dev/disk/by-id/ata-HOST)") in plan.stdout
    assert "+scsi3:" not in plan.stdout and "--scsi3" not in plan.stdout
    assert "+scsi1: ceph-krbd:vm-102-disk-1,cache=none," in plan.stdout  # the VM's other fixes are planned
    named = _cli("fix", "--root", str(tree), "--pve-volume", "/dev/disk/by-id/ata-HOST")
    assert named.returncode == 0, named.stderr
    assert "+scsi3: /dev/disk/by-id/ata-HOST,cache=none" in named.stdout
