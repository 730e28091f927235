"""kvmtune verify end to end with real qemu-storage-daemon, fio, namespaces and the fix journal."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvmtune.cli import main
from kvmtune.verify.measure import VERDICTS

pytestmark = pytest.mark.integration
HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
KVMTUNE = [sys.executable, "-m", "kvmtune"]


def _need(*tools: str) -> None:
    for t in tools:
        if shutil.which(t) is None:
            pytest.skip(f"{t} not installed")


def _scratch(where: Path) -> list[Path]:
    return sorted(where.glob(".kvmtune-verify-*"))


def _pids_mentioning(text: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if text.encode() in (d / "cmdline").read_bytes():
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def test_examples_block_tier_verdicts_stored_and_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _need("qemu-storage-daemon", "fio", "qemu-img")
    work, db = tmp_path / "work", tmp_path / "results.db"
    code = main(["verify", "--examples", "--only", "KVM-STO-010,KVM-STO-005", "--repeat", "2", "--seconds", "0.5",
                 "--size", "256M", "--workdir", str(work), "--db", str(db), "--format", "json"])
    out = capsys.readouterr().out
    assert code == 0, out
    doc = json.loads(out)
    measured = {r["rule"] + " " + r["target"]: r for r in doc["results"] if r["measurement"]}
    discard = measured["KVM-STO-010 web01-legacy disk:hda"]
    assert discard["verdict"] == "helps" and discard["measurement"]["after"] < discard["measurement"]["before"] / 10
    writeback = measured["KVM-STO-005 app02-clone disk:vdb"]
    assert writeback["verdict"] in VERDICTS and writeback["change"] == "cache writeback → none, io threads → native"
    assert writeback["measurement"]["interval_95"] is not None and writeback["tier"] == "block"
    assert _scratch(work) == [] and _pids_mentioning(str(work)) == []
    with sqlite3.connect(db) as con:  # the run keeps the arguments, not the parser's command object
        stored = json.loads(con.execute("SELECT args FROM runs WHERE id = ?", (doc["run"],)).fetchone()[0])
    assert stored["command"] == "verify" and stored["repeat"] == 2 and "command_object" not in stored
    assert main(["report", str(doc["run"]), "--db", str(db)]) == 0
    report = capsys.readouterr().out
    assert "verified fixes:" in report and "KVM-STO-010 web01-legacy disk:hda: discard ignore → unmap" in report


def test_defaults_settle_seed_003s_slow_disk_as_helps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """web01-legacy's disk is seed 003's slow disk (qcow2 without preallocation, write-through). With the default
    options, verify goes on adding rounds until the cache fix is settled: helps, not "no measurable effect"."""
    _need("qemu-storage-daemon", "fio", "qemu-img")
    code = main(["verify", "--examples", "--only", "KVM-STO-002", "--workdir", str(tmp_path), "--no-store",
                 "--format", "json"])
    out = capsys.readouterr().out
    assert code == 0, out
    (r,) = [r for r in json.loads(out)["results"] if r["measurement"]]
    m = r["measurement"]
    assert r["change"].startswith("cache writethrough → none") and r["verdict"] == "helps", m
    assert m["interval_95"][0] > 1.05 and m["n"] >= 3


NATIVE_WRITETHROUGH = """<domain type='kvm'><name>nostart01</name><memory unit='MiB'>512</memory><vcpu>1</vcpu>
  <os><type arch='x86_64' machine='q35'>hvm</type></os>
  <devices><disk type='file' device='disk'>
    <driver name='qemu' type='qcow2' cache='writethrough' io='native'/>
    <source file='/var/lib/libvirt/images/nostart01.qcow2'/><target dev='vda' bus='virtio'/>
  </disk></devices></domain>
"""


def test_a_disk_qemu_refuses_is_confirmed_and_its_other_fixes_measured(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """io='native' with write-through does not start under QEMU: verify says so once per fix, and measures every
    fix from the nearest setting that starts (io threads) instead of failing each with the daemon's error."""
    _need("qemu-storage-daemon", "fio", "qemu-img")
    xml = tmp_path / "nostart01.xml"
    xml.write_text(NATIVE_WRITETHROUGH)
    code = main(["verify", str(xml), "--only", "KVM-STO-007,KVM-STO-002", "--repeat", "2", "--seconds", "0.3",
                 "--finding-budget", "4", "--size", "64M", "--workdir", str(tmp_path / "w"), "--no-store"])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = [ln for ln in out.splitlines() if ln.startswith(("KVM-STO-007", "KVM-STO-002"))]
    assert len(lines) == 2 and not any("measurement failed" in ln for ln in lines), out
    for ln in lines:
        assert "(from the nearest valid A: io native → threads)" in ln and "ratio" in ln, ln
    assert out.count("does not start under QEMU: this confirms KVM-STO-007") == 2, out


def test_assume_this_host_replicates_the_images_own_facts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A domain file whose qcow2 image is here: with --assume-this-host verify reads it (qemu-img info, read-only)
    and the replicas get its cluster size and preallocation, not qcow2's defaults; the image is left as it was."""
    _need("qemu-storage-daemon", "fio", "qemu-img")
    image = tmp_path / "img" / "db02.qcow2"
    image.parent.mkdir()
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-o", "preallocation=metadata,cluster_size=128k",
                    str(image), "64M"], check=True)
    before = (image.stat().st_mtime_ns, image.read_bytes())
    xml = tmp_path / "db02.xml"
    xml.write_text(NATIVE_WRITETHROUGH.replace("nostart01", "db02").replace(" io='native'", "").replace(
        "/var/lib/libvirt/images/db02.qcow2", str(image)))
    argv = ["verify", str(xml), "--only", "KVM-STO-002", "--repeat", "2", "--seconds", "0.3", "--finding-budget", "2",
            "--size", "64M", "--workdir", str(tmp_path / "w"), "--no-store", "--format", "json"]
    assert main(argv) == 0
    (plain,) = json.loads(capsys.readouterr().out)["results"]
    assert any("image not readable here" in n for n in plain["notes"]), plain["notes"]
    assert main([*argv, "--assume-this-host"]) == 0
    (here,) = json.loads(capsys.readouterr().out)["results"]
    assert not any("image not readable here" in n for n in here["notes"]), here["notes"]
    assert "128 KiB clusters, preallocation metadata" in here["details"]["before_layout"], here["details"]
    assert here["verdict"] is not None and (image.stat().st_mtime_ns, image.read_bytes()) == before


def test_text_lines_name_rule_change_metric_verdict_and_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _need("qemu-storage-daemon", "fio", "qemu-img")
    code = main(["verify", "--examples", "--only", "KVM-STO-010,KVM-STO-001", "--repeat", "2", "--seconds", "0.3",
                 "--size", "128M", "--workdir", str(tmp_path), "--no-store"])
    out = capsys.readouterr().out
    assert code == 0
    assert "block tier: qemu-storage-daemon + fio over NBD on scratch replicas, at host speed (no guest, no TCG)" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("KVM-STO-010 web01-legacy disk:hda"))
    assert "allocated" in line and "-> " in line and "ratio" in line and "HELPS" in line and "scratch replicas" in line
    # the bus change is the guest tier's: measured under KVM, else "needs KVM" with the command that measures it anyway
    bus = next(ln for ln in out.splitlines() if "KVM-STO-001 web01-legacy disk:hda" in ln)
    assert (("not measured: needs KVM" in bus and "kvmtune verify --examples --only KVM-STO-001 --allow-tcg" in bus)
            or ("disk bus ide → virtio" in bus and "guest tier" in out)), bus


def test_sigterm_mid_measurement_leaves_no_replica(tmp_path: Path) -> None:
    _need("qemu-storage-daemon", "fio", "qemu-img")
    work = tmp_path / "work"
    proc = subprocess.Popen([*KVMTUNE, "verify", "--examples", "--only", "KVM-STO-005", "--seconds", "3",
                             "--workdir", str(work), "--no-store"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (_scratch(work) and _pids_mentioning(f"socket={work}")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _scratch(work), "the experiment never started"
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    assert _scratch(work) == [] and _pids_mentioning(str(work)) == []


def test_sigkill_leaves_no_replica_file_and_the_next_run_sweeps(tmp_path: Path) -> None:
    _need("qemu-storage-daemon", "fio", "qemu-img")
    work = tmp_path / "work"
    proc = subprocess.Popen([*KVMTUNE, "verify", "--examples", "--only", "KVM-STO-005", "--seconds", "3",
                             "--workdir", str(work), "--no-store"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not _pids_mentioning(f"socket={work}") and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.kill()
        proc.wait(timeout=30)
        left = _scratch(work)
        assert left, "the experiment never started"
        assert [p for d in left for p in d.iterdir() if p.name.startswith("replica-")] == []  # unlinked once open
    finally:
        for pid in _pids_mentioning(str(work)):  # the daemon, if the kernel has not taken it down with kvmtune
            os.kill(pid, signal.SIGKILL)
    assert main(["verify", "--examples", "--only", "KVM-STO-010", "--repeat", "1", "--seconds", "0.2",
                 "--size", "128M", "--workdir", str(work), "--no-store"]) == 0
    assert _scratch(work) == []


@pytest.fixture
def loop_root(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A host tree whose virtual disk vdz is a loop device this test made (bfq, ext4 mounted in tmp_path)."""
    _need("losetup", "mkfs.ext4", "fio")
    if os.geteuid() != 0:
        pytest.skip("needs root for a loop device")
    img, mnt = tmp_path / "disk.img", tmp_path / "mnt"
    with open(img, "wb") as f:
        f.truncate(300 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=True)
    dev = subprocess.run(["losetup", "-f", "--show", str(img)], check=True, capture_output=True, text=True).stdout.strip()
    mnt.mkdir()
    try:
        subprocess.run(["mount", dev, str(mnt)], check=True)
        try:
            name = os.path.basename(dev)
            sched = Path(f"/sys/block/{name}/queue/scheduler")
            if "bfq" not in sched.read_text():
                pytest.skip("bfq is not offered on loop devices here")
            sched.write_text("bfq\n")
            root = tmp_path / "root"
            vdz = root / "sys" / "block" / "vdz"
            vdz.mkdir(parents=True)
            (root / "proc").mkdir()
            (root / "proc" / "mounts").write_text(f"{dev} {mnt} ext4 rw,relatime 0 0\n")
            # the loop device's live sysfs directory, mounted inside the tree (a link out of it is not followed)
            subprocess.run(["mount", "--bind", f"/sys/block/{name}", str(vdz)], check=True)
            try:
                yield root, name
            finally:
                _unmount(vdz)
        finally:
            _unmount(mnt)
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)


def _unmount(path: Path) -> None:
    """Unmount even while a just-killed fio still has files open there (its exit closes them a moment later)."""
    deadline = time.monotonic() + 20
    while subprocess.run(["umount", str(path)], capture_output=True, check=False).returncode != 0:
        if not os.path.ismount(path):
            return
        if time.monotonic() > deadline:
            subprocess.run(["umount", "--lazy", str(path)], check=False)  # detached now, freed when the last file closes
            return
        time.sleep(0.2)


def _scheduler(name: str) -> str:
    text = Path(f"/sys/block/{name}/queue/scheduler").read_text()
    return text.split("[", 1)[1].split("]", 1)[0]


def test_host_change_that_does_not_help_is_undone_through_the_journal(
    loop_root: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, name = loop_root
    journals = tmp_path / "journal"
    # a threshold no scheduler change can reach: whatever it measures, the change does not help enough
    code = main(["verify", "--host", "--root", str(root), "--only", "KVM-HST-004", "--apply", "--yes",
                 "--threshold", "100000", "--repeat", "2", "--seconds", "0.5", "--journal-dir", str(journals),
                 "--workdir", str(tmp_path / "w"), "--no-store", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0, [r["error"] for r in doc["results"]]
    (r,) = [r for r in doc["results"] if r["measurement"]]
    assert r["verdict"] != "helps" and r["action"].startswith("undone automatically")
    assert _scheduler(name) == "bfq"
    (jfile,) = journals.glob("*.json")
    journal = json.loads(jfile.read_text())
    assert journal["state"] == "undone" and [e["status"] for e in journal["changes"]] == ["undone"]
    assert journal["changes"][0]["prior"] == "bfq" and journal["changes"][0]["new"] == "none"
    assert _scratch(tmp_path / "mnt") == []


def test_keep_leaves_the_change_and_undo_restores_it(
    loop_root: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, name = loop_root
    journals = tmp_path / "journal"
    code = main(["verify", "--host", "--root", str(root), "--only", "KVM-HST-004", "--apply", "--keep", "--yes",
                 "--threshold", "100000", "--repeat", "1", "--seconds", "0.3", "--journal-dir", str(journals),
                 "--workdir", str(tmp_path / "w"), "--no-store"])
    out = capsys.readouterr().out
    assert code == 0 and "kept (--keep)" in out
    assert _scheduler(name) == "none"
    (jfile,) = journals.glob("*.json")
    # the kept line names the undo command that works from anywhere (a tree's journal needs its --root)
    hint = re.search(r"'(kvmtune undo [^']*)' restores", out)
    assert hint is not None, out
    argv = shlex.split(hint.group(1))[1:]
    assert argv == ["undo", "--root", str(root.resolve()), "--journal-dir", str(journals.resolve()), jfile.stem]
    assert main([*argv, "--yes"]) == 0
    assert _scheduler(name) == "bfq"


def test_without_apply_host_wide_findings_are_listed_not_changed(
    loop_root: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, name = loop_root
    assert main(["verify", "--host", "--root", str(root), "--only", "KVM-HST-004", "--workdir", str(tmp_path / "w"),
                 "--no-store", "--journal-dir", str(tmp_path / "j")]) == 0
    assert "host-wide change: measured only with --apply" in capsys.readouterr().out
    assert _scheduler(name) == "bfq" and not (tmp_path / "j").exists()


def test_namespace_settings_measured_in_kvmtune_namespaces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    from kvmtune.lab.net.netload import REPO_NETLOAD

    if shutil.which("netload") is None and not REPO_NETLOAD.is_file():
        pytest.skip("netload is not built (make -C netload)")
    before = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    code = main(["verify", "--host", "--root", str(HOSTS / "ksm-overcommit"), "--only", "KVM-HST-015,KVM-HST-013",
                 "--repeat", "2", "--seconds", "0.5", "--workdir", str(tmp_path), "--no-store"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "KVM-HST-015 net:vnet3: txqueuelen 1000 → 2500: throughput" in out
    assert "KVM-HST-013 sysctl:net.ipv4.tcp_rmem: net.ipv4.tcp_rmem 4096 131072 6291456 → 4096 131072 16777216" in out
    after = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    assert {n for n in after - before if n.startswith(f"kvmtune-v{os.getpid()}")} == set()


def test_images_are_replicated_next_to_themselves_and_left_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _need("qemu-storage-daemon", "fio", "qemu-img")
    images = tmp_path / "images"
    images.mkdir()
    qcow = images / "guest.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-o", "cluster_size=131072", str(qcow), "1G"], check=True)
    before, mtime = qcow.read_bytes(), qcow.stat().st_mtime_ns
    code = main(["verify", "--images", str(qcow), "--only", "KVM-IMG-002", "--repeat", "2", "--seconds", "0.3",
                 "--size", "128M", "--workdir", str(tmp_path / "w"), "--no-store", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    (r,) = [r for r in doc["results"] if r["measurement"]]
    assert r["change"] == "preallocation off → metadata" and r["details"]["replica_dir"] == str(images)
    assert "128 KiB clusters" in r["details"]["before_layout"]
    assert qcow.read_bytes() == before and qcow.stat().st_mtime_ns == mtime and _scratch(images) == []


def _journal_applied(journals: Path) -> Path | None:
    for j in journals.glob("*.json"):
        try:
            if json.loads(j.read_text())["state"] == "applied":
                return j
        except (OSError, ValueError, KeyError):
            continue
    return None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_stopped_during_a_host_experiment_the_host_is_as_before_or_as_the_journal_says(
    loop_root: tuple[Path, str], tmp_path: Path, sig: signal.Signals
) -> None:
    root, name = loop_root
    journals = tmp_path / "journal"
    proc = subprocess.Popen([*KVMTUNE, "verify", "--host", "--root", str(root), "--only", "KVM-HST-004", "--apply",
                             "--yes", "--threshold", "100000", "--seconds", "2", "--journal-dir", str(journals),
                             "--workdir", str(tmp_path / "w"), "--no-store"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while _journal_applied(journals) is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        journal = _journal_applied(journals)
        if journal is None:
            err = proc.communicate(timeout=30)[1] if proc.poll() is not None else "still running"
            pytest.fail(f"the change was never applied: {err}")
        assert _scheduler(name) == "none"
        time.sleep(0.3)
        proc.send_signal(sig)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    state = json.loads(journal.read_text())["state"]
    if sig == signal.SIGTERM:
        assert proc.returncode == 130 and state == "undone" and _scheduler(name) == "bfq"
    else:  # no chance to clean up: the journal says what was changed, and undo restores it
        assert state == "applied" and _scheduler(name) == "none"
        assert main(["undo", "--root", str(root), journal.stem, "--journal-dir", str(journals), "--yes"]) == 0
        assert _scheduler(name) == "bfq"
    for pid in _pids_mentioning(str(tmp_path / "mnt")):
        os.kill(pid, signal.SIGKILL)  # fio, when SIGKILL left it running
    assert _scheduler(name) == "bfq"


def test_sigkill_at_random_points_of_a_host_apply_leaves_the_tree_as_the_journal_says(
    loop_root: tuple[Path, str], tmp_path: Path
) -> None:
    """Issue 29 ("also to run"): `verify --host --root TREE --apply` SIGKILLed at points drawn from a fixed seed,
    over planning, the journaled write and the measurement. After each kill: nothing it started runs; the
    scheduler is as before, or the tree's journal says it was applied and `undo --root TREE` puts it back;
    the next run removes the scratch directory the killed one left on the device's file system, and says so."""
    import random

    root, name = loop_root
    mnt = tmp_path / "mnt"
    journals, work = tmp_path / "journal", tmp_path / "w"
    argv = [*KVMTUNE, "verify", "--host", "--root", str(root), "--only", "KVM-HST-004", "--apply", "--yes",
            "--threshold", "100000", "--seconds", "2", "--repeat", "2", "--journal-dir", str(journals),
            "--workdir", str(work), "--no-store"]
    rng = random.Random(29)
    for delay in sorted(rng.uniform(0.2, 6.0) for _ in range(3)):
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        gone_by = time.monotonic() + 2.0
        while _pids_mentioning(str(work)) and time.monotonic() < gone_by:
            time.sleep(0.05)
        assert _pids_mentioning(str(work)) == [], f"kill at {delay:.2f}s: processes survived"
        applied = _journal_applied(journals)
        if _scheduler(name) != "bfq":
            assert applied is not None, f"kill at {delay:.2f}s: the scheduler changed with no applied journal"
        if applied is not None:
            assert main(["undo", "--root", str(root), applied.stem, "--journal-dir", str(journals), "--yes"]) == 0
        assert _scheduler(name) == "bfq", f"kill at {delay:.2f}s"
        left = _scratch(mnt)
        run = subprocess.run(argv, capture_output=True, text=True, timeout=180)
        assert run.returncode == 0, run.stderr[-600:]
        assert _scratch(mnt) == [] and _scheduler(name) == "bfq"  # the change did not help: undone again
        for stale in left:
            assert f"removed {stale}" in run.stdout, (delay, run.stdout[-800:])
