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
    assert left == {"KVM-CPU-001", "KVM-NET-001", "KVM-STO-012"}  # guest-visible: only with --allow-bus-change

    undo = next(line for line in applied.stdout.splitlines() if line.startswith("Undo with: "))
    undone = _cli(*undo.removeprefix("Undo with: kvmtune ").split(), "--yes")
    assert undone.returncode == 0, undone.stderr
    assert _sums(tree) == before
