"""The guest tier booted for real (two probe guests under KVM where it works, else TCG).

- A and B really differ in the device QEMU was given, read back over QMP (query-pci, query-block,
  query-iothreads, qom-get of the disk's queues);
- SIGTERM and SIGKILL of ``kvmtune verify --allow-tcg`` leave no QEMU, tap, namespace or scratch disk;
- ``test_ci_guest_tier_experiment`` (marked ``guest_tier``: CI runs it as its own step) measures KVM-STO-001
  with small settings, labels it, stores the accelerator, and leaves the example domains' files unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules, select_rules
from kvmtune.domain.xml import guest_from_tree, parse_xml_bytes
from kvmtune.host.root import HostRoot
from kvmtune.lab.guest import GUEST_AGENT_BINARY
from kvmtune.lab.probe.pair import DISK_DEV, DISK_ID, ProbePair
from kvmtune.lab.qemu import IOTHREAD_ID
from kvmtune.lab.vocabulary import NOT_COMPARABLE
from kvmtune.runner import Runner
from kvmtune.verify.engine import plan_all, subjects
from kvmtune.verify.experiments import VerifyContext
from kvmtune.verify.guest.accel import EMULATION, pair_accel
from kvmtune.verify.guest.disk import GuestDiskExperiment

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "src" / "kvmtune" / "examples"
KVMTUNE = [sys.executable, "-m", "kvmtune"]
VIRTIO_BLK = {0x1001, 0x1042}  # virtio-blk-pci, transitional and modern
REPLICA_PARENT = Path("/var/lib/libvirt/images")  # where web01-legacy's disk lives: its replicas go there if it exists


def _need() -> None:
    for tool in ("qemu-system-x86_64", "qemu-img", "fio"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed")
    if not os.path.isfile(GUEST_AGENT_BINARY):
        pytest.skip("qemu-guest-agent not installed (scripts/install.sh installs it)")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    _need()
    work = tmp_path_factory.mktemp("guest-tier")
    yield work
    shutil.rmtree(work, ignore_errors=True)


def _experiment(workdir: Path, example: str, rule: str) -> tuple[GuestDiskExperiment, VerifyContext]:
    ctx = VerifyContext(runner=Runner(), host=HostRoot("/"), root="/", workdir=workdir, allow_tcg=True, size=128 << 20)
    xml = EXAMPLES / example
    guest = guest_from_tree(parse_xml_bytes(xml.read_bytes(), str(xml)), str(xml), "xml")
    findings = run_rules(AuditContext(host=HostRoot("/")), [guest], [], False, select_rules([rule], []))
    (p, *_rest) = plan_all(subjects(findings, [guest], []), ctx)
    assert isinstance(p.experiment, GuestDiskExperiment), p.result.reason
    return p.experiment, ctx


def _pair(exp: GuestDiskExperiment, ctx: VerifyContext) -> ProbePair:
    accel = pair_accel(ctx)
    return ProbePair(exp.a, exp.b, runner=ctx.runner, workdir=ctx.workdir, accel=accel.accel, disk_size=ctx.size)


def _pci(pair: ProbePair, side: str) -> list[dict[str, object]]:
    return [d for bus in pair.qmp(side, "query-pci") for d in bus["devices"]]


def test_sto001_sides_really_get_ide_and_virtio_blk(workdir: Path) -> None:
    exp, ctx = _experiment(workdir, "web01-legacy.xml", "KVM-STO-001")
    with _pair(exp, ctx) as pair:
        blocks = {s: {b["device"]: b for b in pair.qmp(s, "query-block")} for s in "AB"}
        pci = {s: _pci(pair, s) for s in "AB"}
        ls = {s: pair.exec(s, ["/bin/ls", "/sys/block"], 60).stdout.split() for s in "AB"}
        accel = pair.accel
    assert accel == pair_accel(ctx).accel
    # the scratch disk is the drive of both, on another device: ide-hd (A) and virtio-blk-pci (B)
    assert blocks["A"][DISK_ID]["qdev"] == DISK_DEV and blocks["A"][DISK_ID]["inserted"]["drv"] == "qcow2"
    assert blocks["B"][DISK_ID]["qdev"] == f"/machine/peripheral/{DISK_DEV}/virtio-backend"
    assert not [d for d in pci["A"] if d["id"]["device"] in VIRTIO_BLK]  # type: ignore[index]
    (blk,) = [d for d in pci["B"] if d["id"]["device"] in VIRTIO_BLK]  # type: ignore[index]
    assert blk["qdev_id"] == DISK_DEV
    assert "sda" in ls["A"] and "vda" in ls["B"]  # and the guest's kernel drives each as its bus


def test_sto009_and_sto011_sides_differ_in_iothread_and_queues(workdir: Path) -> None:
    exp, ctx = _experiment(workdir, "hpc01-pinned.xml", "KVM-STO-011")
    with _pair(exp, ctx) as pair:
        path = f"/machine/peripheral/{DISK_DEV}/virtio-backend"
        queues = {s: pair.qmp(s, "qom-get", {"path": path, "property": "num-queues"}) for s in "AB"}
    # pc-q35-5.1's compat (hw_compat_5_1) gives side A one queue; the fixer's queues=8 gives B eight
    assert queues == {"A": 1, "B": 8}
    exp, ctx = _experiment(workdir, "app02-clone.xml", "KVM-STO-009")
    with _pair(exp, ctx) as pair:
        threads = {s: [t["id"] for t in pair.qmp(s, "query-iothreads")] for s in "AB"}
        link = pair.qmp("B", "qom-get", {"path": f"/machine/peripheral/{DISK_DEV}/virtio-backend",
                                         "property": "iothread"})
    assert threads == {"A": [], "B": [IOTHREAD_ID]} and IOTHREAD_ID in str(link)


# --------------------------------------------------------------------------- killed runs


def _mentioning(text: str) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if text.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    out.append(int(entry))
            except OSError:
                continue
    return out


def _scratch_of(pid: int, parents: list[Path]) -> list[Path]:
    """Scratch directories the run ``pid`` made (their owner file names it)."""
    out = []
    for parent in parents:
        for d in parent.glob(".kvmtune-verify-*") if parent.is_dir() else []:
            try:
                if (d / "owner").read_text().strip() == str(pid):
                    out.append(d)
            except OSError:
                continue
    return out


def _net_state() -> tuple[set[str], set[str]]:
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    return set(os.listdir("/sys/class/net")), {ln.split()[0] for ln in ns.splitlines() if ln.strip()}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_killed_guest_tier_run_leaves_nothing(workdir: Path, tmp_path: Path, sig: signal.Signals) -> None:
    work = tmp_path / "w"
    links_before, ns_before = _net_state()
    proc = subprocess.Popen([*KVMTUNE, "verify", "--examples", "--only", "KVM-STO-001", "--allow-tcg", "--repeat", "50",
                             "--seconds", "1", "--size", "128M", "--workdir", str(work), "--no-store"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    parents = [work, REPLICA_PARENT]
    try:
        deadline = time.monotonic() + 240
        while len(_mentioning(str(work / ".kvmtune-verify-"))) < 2 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1].decode(errors="replace")[-800:]
            time.sleep(0.1)
        qemus = _mentioning(str(work / ".kvmtune-verify-"))
        assert len(qemus) >= 2, "the two probe guests never started"
        time.sleep(3)  # into the measurement
        assert _scratch_of(proc.pid, parents), "no scratch directory while measuring"
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    gone_by = time.monotonic() + 10
    while _mentioning(str(work / ".kvmtune-verify-")) and time.monotonic() < gone_by:
        time.sleep(0.1)
    assert _mentioning(str(work / ".kvmtune-verify-")) == [], "a QEMU survived the killed verify"
    if sig == signal.SIGTERM:
        assert proc.returncode != 0 and b"Traceback" not in err, err.decode(errors="replace")[-800:]
    else:  # nothing ran in kvmtune after SIGKILL: the next verify sweeps what is left
        subprocess.run([*KVMTUNE, "verify", "--examples", "--only", "KVM-STO-001", "--workdir", str(work), "--no-store"],
                       capture_output=True, timeout=300, check=False)
    assert _scratch_of(proc.pid, parents) == []
    links_after, ns_after = _net_state()
    assert links_after - links_before == set() and ns_after - ns_before == set()  # no tap, no namespace


# --------------------------------------------------------------------------- the CI experiment


def _sums() -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(EXAMPLES.glob("*.xml"))}


@pytest.mark.guest_tier
def test_ci_guest_tier_experiment(workdir: Path, tmp_path: Path) -> None:
    """KVM-STO-001 (IDE → virtio-blk) measured in two probe guests with small settings (about a minute under TCG on
    2 cores); labelled with its accelerator, stored with it; the example domains' files are unchanged."""
    before = _sums()
    db = tmp_path / "r.db"
    res = subprocess.run([*KVMTUNE, "verify", "--examples", "--only", "KVM-STO-001", "--allow-tcg", "--repeat", "2",
                          "--seconds", "0.5", "--finding-budget", "10", "--size", "128M", "--workdir", str(workdir),
                          "--db", str(db), "--format", "json"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-1500:]
    doc = json.loads(res.stdout)
    (r,) = [x for x in doc["results"] if x["rule"] == "KVM-STO-001"]
    assert r["tier"] == "guest" and r["change"] == "disk bus ide → virtio", r
    m = r["measurement"]
    assert m is not None and m["before"] > 0 and m["after"] > 0 and m["n"] >= 2 and m["interval_95"] is not None
    accel = r["accel"]
    assert accel in ("kvm", "tcg")
    if accel == "tcg":
        assert r["verdict"] == NOT_COMPARABLE and r["emulation"] == EMULATION
        assert r["details"]["verdict_under_emulation"] in ("helps", "hurts", "no measurable effect", "inconclusive")
    else:
        assert r["verdict"] != NOT_COMPARABLE and r["emulation"] is None
    with sqlite3.connect(db) as con:
        (env,) = con.execute("SELECT env FROM runs WHERE id = ?", (doc["run"],)).fetchone()
    env = json.loads(env)
    assert env["accel"] == accel and "guest" in env["kvmtune_tiers"], env
    assert _sums() == before
    assert list(workdir.glob(".kvmtune-verify-*")) == []
