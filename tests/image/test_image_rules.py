"""Every image rule fires on a real image that has its problem and stays silent on one that has not."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.audit.finding import Finding, Severity
from kvmtune.audit.rule import ImageRule, all_rules, rule_by_id
from kvmtune.host.parsers import Mount
from kvmtune.host.root import HostRoot
from kvmtune.qemu.image import DiskImage, ImageUse, read_image
from kvmtune.runner import Runner


def audit(rule_id: str, imgs: list[DiskImage]) -> list[Finding]:
    rule = rule_by_id(rule_id)
    assert rule is not None
    ctx = AuditContext(host=HostRoot("/"), runner=Runner())
    found = run_rules(ctx, images=imgs, rules=[rule])
    assert ctx.errors == []
    return found


def load(path: Path, mounts: list[Mount] | None = None, uses: list[ImageUse] | None = None) -> DiskImage:
    declared = {u.declared_format for u in uses or [] if u.declared_format}
    img = read_image(str(path), Runner(), mounts or [], declared_format=declared.pop() if len(declared) == 1 else None)
    img.used_by.extend(uses or [])
    return img


def use(cache: str | None = "none", fmt: str | None = None) -> ImageUse:
    return ImageUse("db01", "vda", cache, "file", fmt, "db01.xml", True)


def corrupt(images: dict[str, Path], tmp: Path) -> Path:
    p = tmp / "corrupt.qcow2"
    p.write_bytes(images["prealloc-off.qcow2"].read_bytes())
    with open(p, "r+b") as fh:
        fh.seek(79)
        b = fh.read(1)[0]
        fh.seek(79)
        fh.write(bytes([b | 2]))
    return p


def truncated(images: dict[str, Path], tmp: Path) -> Path:
    p = tmp / "trunc.qcow2"
    p.write_bytes(images["prealloc-off.qcow2"].read_bytes()[:300])
    return p


def huge_sparse(images: dict[str, Path], tmp: Path) -> list[Path]:
    out = []
    for i in range(3):
        p = tmp / f"huge{i}.raw"
        subprocess.run(["qemu-img", "create", "-q", "-f", "raw", str(p), "10T"], check=True)
        out.append(p)
    return out


def nfs_mount(tmp: Path) -> list[Mount]:
    return [Mount("/dev/vda", "/", "ext4", ("rw",)), Mount("filer:/vol/images", str(tmp), "nfs4", ("rw", "vers=4.2"))]


Case = Callable[[dict[str, Path], Path], list[DiskImage]]

CASES: dict[str, tuple[list[Case], list[Case]]] = {
    "KVM-IMG-001": (
        [lambda i, t: [load(i["foreign.vmdk"])], lambda i, t: [load(i["mbr2048-v2.qcow2"])],
         lambda i, t: [load(i["mbr63.qcow2"], uses=[use(fmt="raw")])]],
        [lambda i, t: [load(i["mbr63.qcow2"], uses=[use(fmt="qcow2")])], lambda i, t: [load(i["sparse.raw"])]],
    ),
    "KVM-IMG-002": (
        [lambda i, t: [load(i["prealloc-off.qcow2"])]],
        [lambda i, t: [load(i["prealloc-metadata.qcow2"])], lambda i, t: [load(i["prealloc-falloc.qcow2"])]],
    ),
    "KVM-IMG-003": ([lambda i, t: [load(i["sparse.raw"])]], [lambda i, t: [load(i["falloc.raw"])]]),
    "KVM-IMG-004": (
        [lambda i, t: [load(p) for p in huge_sparse(i, t)]],
        [lambda i, t: [load(i["sparse.raw"]), load(i["prealloc-off.qcow2"])]],
    ),
    "KVM-IMG-005": (
        [lambda i, t: [load(i["chain3.qcow2"], uses=[use(fmt="qcow2")])]],
        [lambda i, t: [load(i["chain1.qcow2"], uses=[use(fmt="qcow2")])],
         # a probed format never opens backing files, so it cannot count them
         lambda i, t: [load(i["chain3.qcow2"])]],
    ),
    "KVM-IMG-006": (
        [lambda i, t: [load(i["big-1t.qcow2"])], lambda i, t: [load(i["small-clusters.qcow2"])]],
        [lambda i, t: [load(i["prealloc-off.qcow2"])]],
    ),
    "KVM-IMG-007": (
        [lambda i, t: [load(i["prealloc-metadata.qcow2"], nfs_mount(i["prealloc-metadata.qcow2"].parent),
                            [use("writethrough")])]],
        [lambda i, t: [load(i["prealloc-metadata.qcow2"], nfs_mount(i["prealloc-metadata.qcow2"].parent),
                            [use("none")])],
         lambda i, t: [load(i["prealloc-metadata.qcow2"], [], [use("writethrough")])]],
    ),
    "KVM-IMG-008": ([lambda i, t: [load(i["sparse.raw"])]], [lambda i, t: [load(i["sparse.raw"], uses=[use()])]]),
    "KVM-IMG-009": (
        [lambda i, t: [load(i["mbr63.raw"])], lambda i, t: [load(i["mbr63.qcow2"])], lambda i, t: [load(i["gpt.qcow2"])]],
        [lambda i, t: [load(i["mbr2048.raw"])], lambda i, t: [load(i["sparse.raw"])]],
    ),
    "KVM-IMG-010": (
        [lambda i, t: [load(corrupt(i, t))], lambda i, t: [load(truncated(i, t))]],
        [lambda i, t: [load(i["prealloc-off.qcow2"])], lambda i, t: [load(i["chain3.qcow2"])]],
    ),
}


def cases(kind: int) -> list[tuple[str, int]]:
    return [(rid, n) for rid, pair in CASES.items() for n in range(len(pair[kind]))]


@pytest.mark.parametrize(("rule_id", "n"), cases(0))
def test_fires(images: dict[str, Path], tmp_path: Path, rule_id: str, n: int) -> None:
    imgs = CASES[rule_id][0][n](images, tmp_path)
    assert rule_id in {f.rule for f in audit(rule_id, imgs)}


@pytest.mark.parametrize(("rule_id", "n"), cases(1))
def test_silent(images: dict[str, Path], tmp_path: Path, rule_id: str, n: int) -> None:
    imgs = CASES[rule_id][1][n](images, tmp_path)
    assert audit(rule_id, imgs) == []


@pytest.mark.parametrize("rule", [r for r in all_rules() if issubclass(r, ImageRule)], ids=lambda r: r.id)
def test_every_image_rule_has_cases(rule: type) -> None:
    assert rule.id in CASES, f"{rule.id} needs fire/silent cases in {__file__}"


def test_alignment_severities_follow_virt_alignment_scan(images: dict[str, Path]) -> None:
    found = audit("KVM-IMG-009", [load(images["mbr63.raw"])])
    by_part = {f.target.device: f for f in found}
    assert by_part[f"image:{images['mbr63.raw']} partition 1"].severity == Severity.HIGH
    assert by_part[f"image:{images['mbr63.raw']} partition 6"].severity == Severity.MEDIUM
    assert "bad (alignment < 4K)" in by_part[f"image:{images['mbr63.raw']} partition 1"].evidence
    gpt = {f.target.device.rsplit(" ", 1)[-1]: f.severity for f in audit("KVM-IMG-009", [load(images["gpt.raw"])])}
    assert gpt == {"1": Severity.INFO, "3": Severity.HIGH}  # BIOS boot carries no I/O; 2 is at 1 MiB


def test_preallocation_severity_with_writethrough(images: dict[str, Path]) -> None:
    [f] = audit("KVM-IMG-002", [load(images["prealloc-off.qcow2"], uses=[use("writethrough")])])
    assert f.severity == Severity.HIGH and "writethrough" in f.actual
    assert "qemu-img map" in f.evidence and "virtual" in f.evidence


def test_storage_overcommit_reports_once_per_filesystem(images: dict[str, Path], tmp_path: Path) -> None:
    imgs = [load(p) for p in huge_sparse(images, tmp_path)]
    found = audit("KVM-IMG-004", imgs)
    assert len(found) == 1 and found[0].target.device.startswith("filesystem:")
    assert "can grow by 30.0 TiB" in found[0].actual


def test_l2_coverage_numbers(images: dict[str, Path]) -> None:
    [f] = audit("KVM-IMG-006", [load(images["big-1t.qcow2"])])
    assert "covers 256.0 GiB" in f.actual and "128.0 MiB" in f.expected
    [g] = audit("KVM-IMG-006", [load(images["small-clusters.qcow2"])])
    assert "covers 16.0 GiB" in g.actual

