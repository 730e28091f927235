"""Issue 52's first two Done-when items, end to end: a trace capture of the probe guest (TCG) under
``--job 'rw=randrw rwmixread=70 bs=16k iodepth=8'`` replayed by ``bench storage --tier block --replay FILE`` and by
``verify DEF.xml --replay FILE --replay-disk vda``; and a replay killed with SIGKILL leaves nothing behind.

The guest's disk is throttled to 600 IOPS over QMP, as in test_capture_integration.py, so the capture sees depth.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvmtune.host.root import HostRoot
from loaded_guest import throttled_probe

pytestmark = pytest.mark.integration

XML = Path(__file__).resolve().parents[1] / "rules" / "KVM-STO-002" / "bad" / "writethrough.xml"


def kvmtune(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvmtune", *args], capture_output=True, text=True, env=os.environ,
                          timeout=timeout)


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A 4-second trace capture of the loaded probe guest: the workload file (its .iolog beside it)."""
    work = tmp_path_factory.mktemp("replay")
    name = f"rep{os.getpid()}"
    with throttled_probe(work, name, seconds=90):
        out = work / "w.json"
        res = kvmtune("capture", name, "--no-libvirt", "--workdir", str(work), "--seconds", "4", "--source", "trace",
                      "-o", str(out))
        assert res.returncode == 0, res.stderr
    assert (work / "w.json.iolog").is_file()
    yield out


def ours(workdir: Path) -> list[str]:
    """qemu-storage-daemon or fio processes whose command line names ``workdir``."""
    host = HostRoot()
    found = []
    for pid in host.listdir("/proc"):
        if pid.isdigit():
            cmd = (host.read_bytes(f"/proc/{pid}/cmdline") or b"").decode(errors="replace")
            if ("qemu-storage-daemon" in cmd or cmd.startswith("fio")) and str(workdir) in cmd:
                found.append(f"{pid} {cmd[:80]}")
    return found


def test_bench_storage_replays_the_capture_and_stores_its_digest(captured: Path, tmp_path: Path) -> None:
    db, wd = tmp_path / "r.db", tmp_path / "wd"
    res = kvmtune("bench", "storage", "--tier", "block", "--replay", str(captured), "--cache", "none,writeback",
                  "--db", str(db), "--workdir", str(wd), "--repeat", "1", "--runtime", "2")
    assert "replaying the workload of disk d0 (the captured iolog, timed)" in res.stderr, res.stderr
    shown = json.loads(kvmtune("results", "show", "1", "--db", str(db), "--format", "json").stdout)
    assert shown["replay"]["digest"] == hashlib.sha256(captured.read_bytes()).hexdigest()
    assert shown["replay"]["source"] == "iolog" and shown["replay"]["mode"] == "timed" and shown["replay"]["disk"] == "d0"
    ok = [c for c in shown["cells"] if c["status"] == "ok"]
    assert {c["workload"] for c in shown["cells"]} == {"replay-timed"}
    assert res.returncode == 0, res.stderr  # no --aio: writeback gets threads, not an impossible native cell
    assert {(c["config"].get("cache"), c["config"].get("aio")) for c in ok if c["config"].get("target") == "file"} == {
        ("none", "native"), ("writeback", "threads")}
    assert all(c["metrics"]["iops"] > 0 and c["metrics"]["iops_read"] > c["metrics"]["iops_write"] for c in ok)
    assert ours(wd) == [] and not list(wd.glob("scratch-*"))


def test_verify_measures_kvm_sto_002_with_the_workload_and_says_so(captured: Path, tmp_path: Path) -> None:
    definition = tmp_path / "web01.xml"
    definition.write_text(XML.read_text().replace("<target dev='hda' bus='ide'/>", "<target dev='vda' bus='virtio'/>"))
    res = kvmtune("verify", str(definition), "--only", "KVM-STO-002", "--replay", str(captured), "--replay-disk", "vda",
                  "--replay-mode", "fast", "--repeat", "2", "--seconds", "1", "--finding-budget", "4", "--no-store",
                  "--workdir", str(tmp_path / "wd"))
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("KVM-STO-002")), "")
    assert "disk:vda" in line and "replayed workload of disk d0 (the captured iolog, fast)" in line, res.stdout + res.stderr
    assert "iops" in line and "measurement failed" not in line


def test_a_replay_killed_with_sigkill_leaves_nothing_behind(captured: Path, tmp_path: Path) -> None:
    db, wd = tmp_path / "r.db", tmp_path / "wd"
    proc = subprocess.Popen([sys.executable, "-m", "kvmtune", "bench", "storage", "--tier", "block", "--replay",
                             str(captured), "--replay-mode", "fast", "--db", str(db), "--workdir", str(wd),
                             "--repeat", "1", "--runtime", "30"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ)
    deadline = time.monotonic() + 30
    while not any("qemu-storage-daemon" in p for p in ours(wd)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert any("qemu-storage-daemon" in p for p in ours(wd)), "the replay never started its storage daemon"
    assert list(wd.glob("scratch-*/kvmtune-replay.iolog")), "the translated log is in the run's scratch directory"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while ours(wd) and time.monotonic() < deadline:  # the runner's children die with kvmtune
        time.sleep(0.1)
    assert ours(wd) == []
    # what is left (its scratch directory, owned by a dead pid) goes with the next run, which says so
    res = kvmtune("bench", "storage", "--tier", "block", "--replay", str(captured), "--db", str(db), "--workdir",
                  str(wd), "--repeat", "1", "--runtime", "1")
    assert res.returncode == 0, res.stderr
    assert not list(wd.glob("scratch-*")) and ours(wd) == []


def test_a_job_synthesized_from_statistics_runs_in_fio_and_says_so(tmp_path: Path) -> None:
    """A crafted workload without a log: fio takes every synthesized option (bssplit, rwmixread, percentage_random,
    iodepth, rate in bytes, fsync) and the timed rate holds within 15 %."""
    disk = {"target": "vda", "source": "trace", "seconds": 3.0, "ops": {"read": 700, "write": 300, "flush": 20,
            "discard": 0}, "read_fraction": 0.7, "iops": 400.0,
            "size_bytes": {"p50": 16384, "mean": 12288, "histogram": {"4096": 333, "16384": 667}},
            "sequential_fraction": 0.1, "queue_depth": {"mean": 2.0, "p95": 4}, "flush_per_write": 0.0625,
            "offset_span_bytes": 64 << 20, "offset_base": None,
            "inter_arrival_us": {"p50": 2500, "p90": 3000, "p99": 4000}, "latency_us": {"p50": 100, "p99": 900}}
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"schema": "kvmtune-workload/1", "guest": "g", "captured_at": "x", "disks": [disk]}))
    db, wd = tmp_path / "r.db", tmp_path / "wd"
    res = kvmtune("bench", "storage", "--tier", "block", "--replay", str(path), "--db", str(db), "--workdir", str(wd),
                  "--repeat", "1", "--runtime", "3")
    assert res.returncode == 0, res.stderr
    assert "synthesized from statistics" in res.stderr
    shown = json.loads(kvmtune("results", "show", "1", "--db", str(db), "--format", "json").stdout)
    assert shown["replay"]["source"] == "statistics" and shown["replay"]["synthesized"] is True
    for c in shown["cells"]:
        assert c["status"] == "ok" and c["metrics"]["iops"] == pytest.approx(400, rel=0.15), c["metrics"]["iops"]
    assert ours(wd) == [] and not list(wd.glob("scratch-*"))
