"""The block tier's plan, finding → experiment: disks are replicated from the audit's model; the planner's CLI input
(each rule's plan: test_verify_plans.py)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.cli.verify import parse_size
from kvmtune.domain.xml import guest_from_tree, parse_xml_bytes
from kvmtune.host.root import HostRoot
from kvmtune.lab.replica import Layout, make_scratch_dir, sweep_leftovers
from kvmtune.runner import Runner
from kvmtune.verify.block.pair import layout_of, scratch_parent
from kvmtune.verify.engine import plan_all, subjects
from kvmtune.verify.experiments import VerifyContext

EXAMPLES = Path(__file__).resolve().parents[2] / "src" / "kvmtune" / "examples"


def _plan(xml: str, tmp_path: Path, only: str) -> list:  # type: ignore[type-arg]
    data = xml.encode()
    guest = guest_from_tree(parse_xml_bytes(data, "t.xml"), "t.xml", "xml")
    ctx = AuditContext(host=HostRoot("/"))
    findings = [f for f in run_rules(ctx, [guest]) if f.rule == only]
    vctx = VerifyContext(runner=Runner(), host=HostRoot("/"), root="/", workdir=tmp_path)
    return plan_all(subjects(findings, [guest], []), vctx)


def _domain(driver: str, source: str) -> str:
    return f"""<domain type='kvm'><name>t</name><memory>1048576</memory><vcpu>2</vcpu>
      <os><type arch='x86_64' machine='pc-q35-8.2'>hvm</type></os><devices>
      <disk type='file' device='disk'><driver name='qemu' {driver}/><source file='{source}'/>
      <target dev='vda' bus='virtio'/></disk></devices></domain>"""


def test_side_b_is_what_the_fixer_writes(tmp_path: Path) -> None:
    planned = _plan(_domain("type='qcow2' cache='writethrough'", "/nonexistent/x.qcow2"), tmp_path, "KVM-STO-002")
    (p,) = planned
    exp = p.experiment
    assert exp is not None and exp.tier == "block"
    assert exp.before == Layout("qcow2", None, "off", "writethrough", "threads", "ignore")
    assert (exp.after.cache, exp.after.io) == ("none", "native")
    assert "cache writethrough → none" in exp.change and "io threads → native" in exp.change
    assert any("qcow2 defaults assumed" in a for a in exp.assumed)
    assert exp.parent_note and "does not exist" in exp.parent_note


def test_manual_format_change_is_measured_as_raw(tmp_path: Path) -> None:
    (p,) = _plan(_domain("type='qcow2' cache='none' io='native'", "/nonexistent/x.qcow2"), tmp_path, "KVM-STO-008")
    assert p.experiment is not None and p.experiment.after.format == "raw" and "qemu-img convert" in p.experiment.by


def test_guest_tier_finding_says_why(tmp_path: Path) -> None:
    xml = _domain("type='raw' cache='none' io='native'", "/x.img").replace("bus='virtio'", "bus='ide'").replace("vda", "hda")
    (p,) = _plan(xml, tmp_path, "KVM-STO-001")
    assert p.experiment is None and "guest tier" in (p.result.reason or "")


def test_layout_from_the_image_model() -> None:
    from kvmtune.model.guest import Disk
    from kvmtune.qemu.image import DiskImage

    img = DiskImage(path="/i", realpath="/i", format="qcow2", cluster_size=2 << 20, preallocation="metadata")
    lay, assumed = layout_of(Disk("vda", format="qcow2", cache="none", io="io_uring", discard="unmap"), img)
    assert lay == Layout("qcow2", 2 << 20, "metadata", "none", "io_uring", "unmap") and assumed == []
    assert lay.direct and not lay.no_flush and not lay.writethrough
    assert "2048 KiB clusters" in lay.describe()


def test_scratch_goes_next_to_an_existing_image_only(tmp_path: Path) -> None:
    images, work = tmp_path / "images", tmp_path / "w"
    images.mkdir()
    (images / "a.qcow2").write_bytes(b"")
    parent, note = scratch_parent(str(images / "a.qcow2"), work)
    assert parent == images and "beside the image" in note
    # a writable directory is not enough: the path a definition names must be the image, there, as a regular file
    (images / "link.qcow2").symlink_to(images / "a.qcow2")
    (images / "dir.qcow2").mkdir()
    for named, why in (("missing.qcow2", "does not exist"), ("link.qcow2", "is not a regular file"),
                       ("dir.qcow2", "is not a regular file")):
        parent, note = scratch_parent(str(images / named), work)
        assert parent == work and why in note and str(work) in note, named
    assert scratch_parent("/dev/null", work)[0] == work
    parent, note = scratch_parent("/nonexistent/dir/a.qcow2", work)
    assert parent == work and "does not exist" in note
    assert scratch_parent("rbd:pool/img", work) == (
        work, f"the disk is not a local file: replicas made in the work directory {work}")


def test_sweep_removes_only_dead_owners(tmp_path: Path) -> None:
    mine = make_scratch_dir(tmp_path)
    dead = make_scratch_dir(tmp_path)
    (dead / "owner").write_text("2147483646\n")  # no such process
    (dead / "replica-A.qcow2").write_bytes(b"x")
    foreign = tmp_path / ".kvmtune-verify-foreign"
    foreign.mkdir()  # no owner file: not touched
    removed = sweep_leftovers([tmp_path])
    assert removed == [str(dead)]
    assert mine.exists() and foreign.exists() and not dead.exists()


@pytest.mark.parametrize(("text", "value"), [("1G", 1 << 30), ("512M", 512 << 20), ("2GiB", 2 << 30)])
def test_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["1", "huge", "10M", "4T"])
def test_bad_size(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size(text)


def test_examples_plan_has_block_experiments(tmp_path: Path) -> None:
    from kvmtune.audit.collect import add_domain_files
    from kvmtune.audit.engine import AuditResult

    result = AuditResult()
    add_domain_files([str(EXAMPLES)], result)
    findings = run_rules(AuditContext(host=HostRoot("/")), result.guests)
    # the accelerator verdict a run decides once (guest tier findings ask for it while planning) is already known
    # here, as `kvmtune guest accel` leaves it: without it, planning boots a probe guest to find out, whatever ran before
    osrelease = Path("/proc/sys/kernel/osrelease").read_text(encoding="utf-8").strip()
    cache = tmp_path / "accel.json"
    cache.write_text(json.dumps({"key": f"probe|qemu|{osrelease}", "at": time.time(),
                                 "choice": {"accel": "tcg", "reason": "a probe guest did not boot under KVM"}}))
    vctx = VerifyContext(runner=Runner(), host=HostRoot("/"), root="/", workdir=tmp_path)
    planned = plan_all(subjects(findings, result.guests, []), vctx)
    measured = {(p.result.finding.rule, p.result.target) for p in planned if p.experiment is not None}
    assert ("KVM-STO-004", "app02-clone disk:vda") in measured
    assert all(p.result.reason for p in planned if p.experiment is None)
    assert os.listdir(tmp_path) == ["accel.json"]  # planning makes nothing


def _run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvmtune", "verify", *argv], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, check=False)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--examples", "--size", "huge"], "not a size"),
        (["--examples", "--repeat", "0"], "must be at least 1"),
        (["--examples", "--keep"], "--keep goes with --apply"),
        (["--examples", "--apply"], "add --yes"),
        (["--root", "/nonexistent", "--host"], "not a directory"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str, tmp_path: Path) -> None:
    res = _run_cli(*argv, "--workdir", str(tmp_path), "--no-store")
    assert res.returncode == 2 and message in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert res.stdout == ""


def test_budget_skips_and_says_so(tmp_path: Path) -> None:
    res = _run_cli("--examples", "--budget", "1", "--workdir", str(tmp_path), "--no-store", "--format", "json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    skipped = [r for r in doc["results"] if r["skipped_for_budget"]]
    assert skipped and all("--budget" in r["not_measured"] for r in skipped)
    assert not any(r["measurement"] for r in doc["results"])
