"""KVM-CPU-001 on a Proxmox VE cluster tree (issue 45, item 5): x86-64-v3 only where this node's CPUs have AVX2,
else 'host' with the migration cost said; the cluster's other nodes, read from ``/etc/pve/nodes/``, are named
where their CPUs must be checked (pmxcfs keeps them in its key-value store, not in a file of the tree)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kvmtune.cli import main
from kvmtune.host.root import HostRoot
from kvmtune.proxmox.load import cluster_nodes, read_host

OPERATOR = Path(__file__).resolve().parents[1] / "fixtures" / "proxmox" / "operator"
HOSTILE = ["pve;rm -rf", "pve\u2028x", "pve x", "-pve", "pve.example", "*"]


def cluster_tree(tmp_path: Path, flags: str | None, *, hostile: bool = False) -> Path:
    """The operator's two VMs on node pve1 of a cluster with pve2 and pve3, laid out as pmxcfs does."""
    tree = tmp_path / "tree"
    pve = tree / "etc" / "pve"
    node_dir = pve / "nodes" / "pve1" / "qemu-server"
    node_dir.mkdir(parents=True)
    for conf in (OPERATOR / "etc" / "pve" / "qemu-server").iterdir():
        shutil.copy(conf, node_dir / conf.name)
    shutil.copy(OPERATOR / "etc" / "pve" / "storage.cfg", pve / "storage.cfg")
    os.symlink("nodes/pve1", pve / "local")
    os.symlink("nodes/pve1/qemu-server", pve / "qemu-server")
    for other in ("pve2", "pve3"):
        (pve / "nodes" / other / "qemu-server").mkdir(parents=True)
    if hostile:
        for name in HOSTILE:
            (pve / "nodes" / name / "qemu-server").mkdir(parents=True)
        outside = tmp_path / "outside"
        (outside / "qemu-server").mkdir(parents=True)
        os.symlink(outside, pve / "nodes" / "pve9")  # a link: pmxcfs has none under nodes/
        (pve / "nodes" / "pve8").write_text("a file, not a node\n")
    if flags is not None:
        (tree / "proc").mkdir()
        (tree / "proc" / "cpuinfo").write_text(f"processor\t: 0\nflags\t\t: {flags}\n\n")
    return tree


def plan(capsys: pytest.CaptureFixture[str], tree: Path) -> str:
    code = main(["fix", "--root", str(tree), "--journal-dir", str(tree.parent / "journal"), "--allow-cpu-change"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out + err


def test_the_cluster_nodes_are_read_from_etc_pve_nodes(tmp_path: Path) -> None:
    host = HostRoot(str(cluster_tree(tmp_path, None)))
    assert cluster_nodes(host) == (["pve1", "pve2", "pve3"], [])
    read = read_host(host)
    assert {c.vmid: (c.node, c.peers) for c in read.configs} == {
        "100": ("pve1", ("pve2", "pve3")), "101": ("pve1", ("pve2", "pve3"))}


def test_x86_64_v3_where_this_node_has_avx2_and_the_other_nodes_named_to_check(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = plan(capsys, cluster_tree(tmp_path, "fpu sse4_2 aes avx avx2"))
    assert "qm set 100 --cpu x86-64-v3" in out and "qm set 101 --cpu x86-64-v3" in out
    assert ("x86-64-v3 needs AVX2 (Intel Haswell, AMD Zen 1 and later) on every node VM 101 may migrate to: this "
            "node's CPUs have it; those of pve2, pve3 are not in /etc/pve") in out
    assert "--cpu x86-64-v2-AES" not in out  # never the current value
    assert "the current x86-64-v2-AES is PVE's default, an accepted migration baseline" in out


def test_host_with_its_migration_cost_where_this_node_lacks_avx2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = plan(capsys, cluster_tree(tmp_path, "fpu sse4_2 aes avx"))
    assert "qm set 101 --cpu host" in out and "x86-64-v3" not in out.split("KVM-CPU-001")[0]
    assert ("'host' passes them through, at the cost of live migrating VM 101 only to nodes with the same CPU "
            "(of this cluster's pve2, pve3)") in out


def test_without_this_nodes_cpus_it_says_they_were_not_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = plan(capsys, cluster_tree(tmp_path, None))
    assert "qm set 101 --cpu x86-64-v3" in out
    assert "this node's CPUs were not read; those of pve2, pve3 are not in /etc/pve" in out


def test_a_single_node_tree_names_no_other_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = cluster_tree(tmp_path, "fpu avx avx2")
    for other in ("pve2", "pve3"):
        shutil.rmtree(tree / "etc" / "pve" / "nodes" / other)
    out = plan(capsys, tree)
    assert "x86-64-v3 needs AVX2 on every node VM 101 runs or migrates on" in out and "not in /etc/pve" not in out


def test_entries_that_are_not_nodes_are_not_counted_and_never_reach_a_fix_text(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = cluster_tree(tmp_path, "fpu avx avx2", hostile=True)
    nodes, skipped = cluster_nodes(HostRoot(str(tree)))
    assert nodes == ["pve1", "pve2", "pve3"]
    assert len(skipped) == len(HOSTILE) + 2  # and the link pve9, the file pve8
    assert all("\u2028" not in s for s in skipped)
    out = plan(capsys, tree)
    assert "those of pve2, pve3 are not in /etc/pve" in out
    for name in (*HOSTILE, "pve9", "pve8"):
        assert f", {name}" not in out and f"{name} are not" not in out
    code = main(["audit", "--root", str(tree), "--format", "json"])
    report, _ = capsys.readouterr()
    assert code == 0 and "/etc/pve/nodes: 8 entry(ies) not a node (a link, or not a node name)" in report
    assert "\u2028" not in report
