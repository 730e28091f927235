"""``bench storage --tier block`` with the real qemu-storage-daemon and fio (issue 22, storage part).

Cells are short (1 s measured, 0.2 s ramp) and images small: the tests check behaviour, not speed
(the speed goals are measured by bench/storage/block_speed.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

import kvmtune.cli as cli
from kvmtune.bench.storage.block import BlockPlan, BlockTier, daemon_argv
from kvmtune.bench.storage.matrix import StorageConfig
from kvmtune.host.root import HostRoot
from kvmtune.lab.storage import fio as fiomod
from kvmtune.lab.store import Store
from kvmtune.qemuopts import CACHE_MODES

KVMTUNE = [sys.executable, "-m", "kvmtune"]
FAST = ["--tier", "block", "--runtime", "1", "--ramp", "0.2", "--disk-size", "64"]

pytestmark = pytest.mark.skipif(
    not (shutil.which("qemu-storage-daemon") and shutil.which("fio")), reason="needs qemu-storage-daemon and fio"
)


def ours(workdir: Path) -> list[str]:
    """Daemons, fio processes, loop devices, mounts or scratch files of this work directory still around."""
    found = [f"dir {p}" for p in workdir.iterdir() if p.name.startswith("scratch-")] if workdir.is_dir() else []
    host = HostRoot()
    for pid in host.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            cmd = (host.read_bytes(f"/proc/{pid}/cmdline") or b"").decode(errors="replace")
            if ("qemu-storage-daemon" in cmd or cmd.startswith("fio")) and str(workdir) in cmd:
                found.append(f"process {pid}: {cmd[:60]}")
    for loop in host.glob("/sys/block/loop*/loop/backing_file"):
        if str(workdir) in (host.read_optional(loop) or ""):
            found.append(f"loop {loop}")
    found += [f"mount {line}" for line in (host.read_optional("/proc/mounts") or "").splitlines() if str(workdir) in line]
    return found


def test_cache_modes_are_libvirts() -> None:
    # libvirt qemuDomainDiskCachemodeFlags(): (writeback, direct, no-flush) per <driver cache=…>
    table = {m: (c.write_cache, c.direct, c.no_flush) for m, c in CACHE_MODES.items()}
    assert table == {"none": (True, True, False), "writethrough": (False, False, False),
                     "writeback": (True, False, False), "directsync": (False, True, False),
                     "unsafe": (True, False, True)}
    argv = daemon_argv("/w/a,b.qcow2", "qcow2", "writethrough", "threads", Path("/w/s.sock"))
    joined = " ".join(argv)
    assert "filename=/w/a,,b.qcow2" in joined  # a comma in a path cannot inject an option
    assert "driver=qcow2,node-name=fmt0,file=proto0,cache.direct=off,cache.no-flush=off" in joined
    assert "writethrough=on" in joined
    assert "writethrough=off" in " ".join(daemon_argv("/w/i", "raw", "none", "native", Path("/w/s")))


def test_first_write_images_hold_many_allocation_units_and_clusters_need_the_larger_image() -> None:
    tier = BlockTier(cast(Any, SimpleNamespace(disk_mib=1024)), BlockPlan(configs=[], workloads=[]))
    write, read = fiomod.BASIC["randwrite-4k"], fiomod.BASIC["randread-4k"]

    def size(fmt: str, prealloc: str, w: fiomod.Workload = write) -> int:
        return tier.image_size(StorageConfig(bus="nbd", fmt=fmt, prealloc=prealloc, tier="block"), w)

    assert size("qcow2", "off") == 16 * 1024  # 262,144 clusters of 64 KiB
    assert size("raw", "off") == size("qcow2", "metadata") == 4 * 1024  # 1,048,576 blocks of 4 KiB
    assert size("raw", "off", read) == 1024  # a read cell's image is filled whole: the disk size


@pytest.mark.integration
def test_block_tier_measures_against_the_floor_and_leaves_nothing(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    db, wd = tmp_path / "r.db", tmp_path / "work"
    code = cli.main(["bench", "storage", *FAST, "--repeat", "2", "--image-format", "raw,qcow2", "--prealloc", "off",
                     "--workload", "randwrite-4k,randread-4k", "--cache", "none", "--aio", "native",
                     "--db", str(db), "--workdir", str(wd)])
    out = capsys.readouterr()
    assert code == 0, out.err
    with Store(db) as st:
        (run,) = st.runs()
        assert run.kind == "block" and run.status == "complete" and run.env["tier"] == "block"
        cells = st.cells(run.id)
    assert len(cells) == 2 * 3 * 2  # (floor + raw + qcow2) × 2 workloads × 2 rounds
    assert {c.rep for c in cells} == {0, 1}
    assert [c.key.split("|")[0] for c in cells[:2]] == ["host/bare-metal"] * 2  # the floor opens every round
    for c in cells:
        assert c.status == "ok", c.error
        assert c.config["tier"] == "block" and c.config["fs_type"] and c.config["runtime_s"] == 1
        assert c.config["iodepth"] == 16 and c.config["bs"] == "4k"
        assert c.metrics["iops"] > 0 and c.metrics["pct_of_bare_metal"] > 0
    fresh = [c for c in cells if c.workload == "randwrite-4k" and c.config.get("fmt") == "qcow2"]
    assert all(50 < c.metrics["unallocated_write_pct"] <= 100 for c in fresh)  # first writes, as seed 003 needs
    assert "(100% of bare metal)" in out.err
    # each round's fresh images are deleted together once the round is over, not while the next cell measures
    assert "kvmtune: round 1: deleted 4 images" in out.err and "kvmtune: round 2: deleted 4 images" in out.err
    assert "median over rounds [95% interval]" in out.out and "% of bare metal (2 rounds)" in out.out
    assert cli.main(["results", "show", "1", "--db", str(db), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    row = next(r for r in summary if r["key"] == "host/bare-metal|randwrite-4k" and r["metric"] == "iops")
    assert row["rounds"] == 2 and row["ci95_low"] <= row["median"] <= row["ci95_high"]
    assert ours(wd) == []


def test_missing_daemon_or_nbd_engine_is_one_line_naming_what_to_install(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("qemu-img", "fio"):  # no qemu-storage-daemon on this PATH
        (bin_dir / tool).symlink_to(shutil.which(tool) or tool)
    res = subprocess.run([*KVMTUNE, "bench", "storage", *FAST, "--repeat", "1", "--db",
                          str(tmp_path / "r.db"), "--workdir", str(tmp_path / "w")],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "PATH": str(bin_dir)})
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "qemu-storage-daemon not found" in lines[-1] and "apt install" in lines[-1]


@pytest.mark.integration
def test_ctrl_c_leaves_no_daemon_socket_image_or_loop_device(tmp_path: Path) -> None:
    db, wd = tmp_path / "r.db", tmp_path / "work"
    proc = subprocess.Popen(
        [*KVMTUNE, "bench", "storage", "--tier", "block", "--runtime", "30", "--repeat", "1",
         "--disk-size", "64", "--target", "block", "--workload", "randread-4k", "--db", str(db), "--workdir", str(wd)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any("qemu-storage-daemon" in x for x in ours(wd)):
        time.sleep(0.1)
    assert any("loop" in x for x in ours(wd)), ours(wd)  # the loop device and the daemon are up
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "marked partial" in err
    with Store(db) as st:
        (run,) = st.runs()
        assert run.status == "partial"
    assert ours(wd) == []


@pytest.mark.integration
def test_a_rounds_write_cells_share_one_fio_process_without_overlapping(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    db, wd = tmp_path / "r.db", tmp_path / "work"
    code = cli.main(["bench", "storage", *FAST, "--repeat", "2", "--image-format", "raw,qcow2", "--prealloc", "off",
                     "--cache", "writeback,none", "--aio", "threads", "--workload", "randwrite-4k",
                     "--db", str(db), "--workdir", str(wd)])
    assert code == 0, capsys.readouterr().err
    with Store(db) as st:
        (run,) = st.runs()
        cells = st.cells(run.id)
        rows = st.db.execute("SELECT raw FROM cells WHERE run_id=? ORDER BY id", (run.id,)).fetchall()
    raws = [json.loads(r[0][r[0].index("{") :]) for r in rows]  # a cell run on its own keeps fio's messages
    assert len(cells) == 2 * 5 and all(c.status == "ok" for c in cells), [c.error for c in cells]
    for rep in (0, 1):
        mine = [(c, raw) for c, raw in zip(cells, raws, strict=True) if c.rep == rep]
        # the floor opens the round; the writeback cells, which leave dirty pages behind, close it
        assert [c.config["cache"] for c, _ in mine] == ["none", "none", "none", "writeback", "writeback"]
        # one fio process ran the round up to the first cell that leaves dirty pages (they would be written
        # back while the next cell measures), the same time stamp in each cell's own JSON; the last ran alone
        stamps = [raw["timestamp_ms"] for _, raw in mine]
        assert len(set(stamps[:4])) == 1 and stamps[4] != stamps[3]
        for k, (c, raw) in enumerate(mine):
            names = [j["jobname"] for j in raw["jobs"]]  # a cell on its own has a ramp job; in a batch, fio's ramp_time
            assert names == ["randwrite-4k"] if k < 4 else names[-1] == "randwrite-4k"
            # ramp, measured time and the gap after the previous job; fio's start and stop count in the first and last
            assert c.metrics["slot_s"] >= 0.2 + 1 and c.metrics["window_s"] >= 1
            assert c.metrics["host_tps"] > 0 or c.config["cache"] == "writeback"  # in the page cache, maybe all of it
            if c.config.get("fmt") == "qcow2":
                assert 50 < c.metrics["unallocated_write_pct"] <= 100, c.key  # counted after the ramp
    assert ours(wd) == []


@pytest.mark.integration
def test_ctrl_c_removes_the_images_made_ahead_for_the_round(tmp_path: Path) -> None:
    db, wd = tmp_path / "r.db", tmp_path / "work"
    proc = subprocess.Popen(
        [*KVMTUNE, "bench", "storage", "--tier", "block", "--runtime", "30", "--repeat", "2",
         "--disk-size", "64", "--image-format", "raw,qcow2", "--prealloc", "off,metadata", "--cache", "none", "--aio",
         "native", "--workload", "randwrite-4k", "--db", str(db), "--workdir", str(wd)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 60
    images: list[Path] = []
    while time.monotonic() < deadline and len(images) < 3:  # raw, qcow2, qcow2+metadata: made while the floor runs
        images = list(wd.glob("scratch-*/img-*"))
        time.sleep(0.1)
    assert {p.suffix for p in images} == {".raw", ".qcow2"}, images
    assert not any("qemu-storage-daemon" in x for x in ours(wd))  # made ahead: no cell has opened them yet
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert not any(p.exists() for p in images) and ours(wd) == []


def test_compare_refuses_to_mix_tiers_and_report_names_the_tier(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "r.db"
    with Store(db) as st:
        for kind, tier in (("quick", "quick"), ("block", "block")):
            rid = st.begin_run(kind, {"accel": "none"}, {})
            for rep, (pre, iops) in enumerate([("off", 100.0), ("metadata", 500.0)] * 3):
                cfg = {"fmt": "qcow2", "prealloc": pre, "cache": "writethrough", "aio": "threads", "target": "file", "tier": tier,
                       "bus": "nbd" if tier == "block" else "none"}
                st.add_cell(rid, f"{pre}|randwrite-4k", cfg, "randwrite-4k", "ok", {"iops": iops * (1 + rep / 100)},
                            rep=rep, accel="none")
            st.finish_run(rid, "complete")
    assert cli.main(["compare", "1", "2", "--db", str(db)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "quick-tier run" in err[0] and "block-tier run" in err[0]
    assert cli.main(["report", "2", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "write-through without preallocation" in ln)
    assert "block tier" in line and "95% interval" in line and ": holds" in line


def test_block_verdicts_need_an_interval(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kvmtune.bench.verdicts import block_verdicts
    from kvmtune.lab.store import CellRow

    def cell(pre: str, iops: float, rep: int) -> CellRow:
        cfg = {"fmt": "qcow2", "prealloc": pre, "cache": "writethrough", "aio": "threads", "target": "file", "tier": "block"}
        return CellRow(rep, 1, "k", cfg, "randwrite-4k", rep, "ok", None, "none", 1.0, {"iops": iops})

    one = block_verdicts([cell("off", 100, 0), cell("metadata", 500, 0)])[0].line()
    assert "inconclusive: no interval" in one
    noisy = block_verdicts([cell("off", 100, 0), cell("off", 300, 1), cell("metadata", 120, 0), cell("metadata", 280, 1)])
    assert "inconclusive: the interval crosses the claim's band 2.5–10×" in noisy[0].line()


def test_verdict_ratios_pair_the_rounds_so_drift_between_rounds_cancels() -> None:
    from kvmtune.bench.verdicts import block_verdicts
    from kvmtune.lab.stats import summarize
    from kvmtune.lab.store import CellRow

    def cell(pre: str, iops: float, rep: int) -> CellRow:
        cfg = {"fmt": "qcow2", "prealloc": pre, "cache": "writethrough", "aio": "threads", "target": "file", "tier": "block"}
        return CellRow(rep, 1, "k", cfg, "randwrite-4k", rep, "ok", None, "none", 1.0, {"iops": iops})

    # the host got twice as fast each round; within each round metadata preallocation was 3× (±2 %) faster
    off, meta = [100.0, 200.0, 400.0], [300.0, 612.0, 1176.0]
    line = block_verdicts([cell(p, v, r) for p, vs in (("off", off), ("metadata", meta)) for r, v in enumerate(vs)])[0].line()
    assert "3.00× (95% interval" in line and "median of 3 per-round ratios" in line and ": holds" in line
    # the same values unpaired (each side in rounds of its own) cannot tell the effect from the drift
    unpaired = [cell("off", v, r) for r, v in enumerate(off)] + [cell("metadata", v, r + 3) for r, v in enumerate(meta)]
    assert "inconclusive" in block_verdicts(unpaired)[0].line()
    s = summarize([90.0, 100.0, 130.0])
    assert s.median == 100.0 and s.low is not None and s.high is not None and s.low < 90.0 and s.high > 130.0
    assert summarize([5.0]).text() == "5 (1 round, no interval)"


def test_options_that_do_not_apply_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, flag, tier in ((["--quick", "--bus", "virtio-blk"], "--bus", "quick"),
                             (["--tier", "block", "--memory", "512"], "--memory", "block"),
                             (["--tier", "guest", "--host-fs", "xfs"], "--host-fs", "guest"),
                             (["--quick", "--preset", "seed-003"], "--preset", "quick")):
        assert cli.main(["bench", "storage", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"kvmtune: {flag}: does not apply to the {tier} tier"), err


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mkfs.xfs"), reason="needs root and xfsprogs")
def test_host_fs_scratch_file_system_is_made_used_and_removed(tmp_path: Path) -> None:
    db, wd = tmp_path / "r.db", tmp_path / "work"
    code = cli.main(["bench", "storage", *FAST, "--repeat", "1", "--host-fs", "xfs", "--workload", "randwrite-4k",
                     "--db", str(db), "--workdir", str(wd)])
    assert code == 0
    with Store(db) as st:
        cells = st.cells(st.runs()[0].id)
    assert len(cells) == 2 and all(c.status == "ok" for c in cells), [c.error for c in cells]
    assert all(c.config["fs_type"] == "xfs" and c.config["device"].startswith("loop") for c in cells)
    assert all(c.key.split("|")[0].endswith("/fs-xfs") and c.metrics.get("host_tps", 0) > 0 for c in cells)
    assert ours(wd) == []


def test_network_options_that_do_not_apply_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, flag in ((["--topology", "bridge", "--ovs-datapath", "netdev"], "--ovs-datapath"),
                       (["--topology", "user", "--vhost", "on"], "--vhost")):
        assert cli.main(["bench", "net", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"kvmtune: {flag}: does not apply to --topology"), err


@pytest.mark.skipif(HostRoot().exists("/sys/class/misc/device-mapper"), reason="device-mapper present: LVM can run")
def test_host_fs_lvm_without_device_mapper_is_refused_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wd = tmp_path / "work"
    assert cli.main(["bench", "storage", *FAST, "--host-fs", "lvm", "--db", str(tmp_path / "r.db"),
                     "--workdir", str(wd)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--host-fs lvm: this kernel has no device-mapper" in err[-1]
    assert ours(wd) == []
