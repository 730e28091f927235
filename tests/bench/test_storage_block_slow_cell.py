"""Issue 50: in a round's shared fio process no cell starts before the previous one has ended, however long
that one takes to drain, and a failed cell is measured once more at the end of its round.

The slow cell is a throttled replica: its qemu-storage-daemon puts a throttle group of 5 IOPS between the
image and the NBD export, so the 16 writes fio keeps in flight take about 3 s to complete once its runtime
is over, far longer than the 0.2 s ramp of the next cell (the old ``startdelay`` schedule started the next
job 0.1 s after the slow one's planned end, and the overlap check refused its figures).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import kvmtune.cli as cli
from kvmtune.bench.storage import block
from kvmtune.lab.storage import fiobatch
from kvmtune.lab.store import Store

FAST = ["--tier", "block", "--runtime", "1", "--ramp", "0.2", "--disk-size", "64", "--repeat", "1", "--aio", "native",
        "--cache", "none", "--workload", "randwrite-4k"]
SLOW_IOPS = 5

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not (shutil.which("qemu-storage-daemon") and shutil.which("fio")),
                       reason="needs qemu-storage-daemon and fio"),
]


def throttled(argv: list[str], iops: int) -> list[str]:
    """qemu-storage-daemon's arguments with a throttle filter of ``iops`` between the format node and the export."""
    k = argv.index("--nbd-server")
    out = [*argv[:k], "--object", f"throttle-group,id=slow,x-iops-total={iops}",
           "--blockdev", "driver=throttle,node-name=thr0,throttle-group=slow,file=fmt0", *argv[k:]]
    export = out.index("--export") + 1
    out[export] = out[export].replace("node-name=fmt0,", "node-name=thr0,")
    return out


def test_a_cell_that_drains_past_its_slot_delays_the_next_one_and_nothing_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    real_argv, real_times = block.daemon_argv, fiobatch.read_times
    stamps: list[tuple[list[str], dict[str, fiobatch.JobTimes]]] = []

    def daemon_argv(image: str, fmt: str, *args: Any, **kw: Any) -> list[str]:
        argv = real_argv(image, fmt, *args, **kw)
        return throttled(argv, SLOW_IOPS) if fmt == "raw" else argv  # the raw image's cell is the slow one

    def read_times(directory: Path, names: list[str]) -> dict[str, fiobatch.JobTimes]:
        times = real_times(directory, names)
        stamps.append((names, times))
        return times

    monkeypatch.setattr(block, "daemon_argv", daemon_argv)
    monkeypatch.setattr(fiobatch, "read_times", read_times)
    db, wd = tmp_path / "r.db", tmp_path / "work"
    code = cli.main(["bench", "storage", *FAST, "--image-format", "raw,qcow2", "--prealloc", "off",
                     "--db", str(db), "--workdir", str(wd)])
    err = capsys.readouterr().err
    with Store(db) as st:
        cells = st.cells(st.runs()[0].id)
    assert [c.key.split("|")[0] for c in cells] == ["host/bare-metal", "nbd/raw-off/none/native", "nbd/qcow2-off/none/native"]
    # the floor, the slow raw cell and the qcow2 cell after it: one fio process, the three jobs in order
    ((names, times),) = stamps
    assert names == ["c0", "c1", "c2"] and set(times) == set(names)
    slow, after = times["c1"], times["c2"]
    # the slow cell really drained past its slot: its 16 writes in flight at 5 IOPS took seconds after its
    # ramp and runtime (1.2 s), where the old schedule started the next cell 0.1 s after them
    assert slow.end - slow.start > 1.2 + 2.0, slow
    assert after.start >= slow.end and times["c1"].start >= times["c0"].end  # each started after the one before ended
    assert code == 0, err
    assert all(c.status == "ok" and c.attempts == 1 for c in cells), [(c.key, c.error) for c in cells]
    assert cells[1].metrics["iops"] < 3 * SLOW_IOPS < cells[2].metrics["iops"]


def test_a_failed_cell_is_retried_once_after_the_rounds_others(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    real_argv = block.daemon_argv
    started: list[str] = []

    def daemon_argv(image: str, fmt: str, *args: Any, **kw: Any) -> list[str]:
        argv = real_argv(image, fmt, *args, **kw)
        started.append(fmt)
        # the raw cell's first daemon refuses its options, and the qcow2 cell's daemon both times
        if fmt == "qcow2" or (fmt == "raw" and started.count("raw") == 1):
            return [argv[0], "--blockdev", "driver=no-such-driver,node-name=x", *argv[1:]]
        return argv

    monkeypatch.setattr(block, "daemon_argv", daemon_argv)
    db, wd = tmp_path / "r.db", tmp_path / "work"
    code = cli.main(["bench", "storage", *FAST, "--image-format", "raw,qcow2", "--prealloc", "off",
                     "--db", str(db), "--workdir", str(wd)])
    err = capsys.readouterr().err
    assert code == 1, err
    with Store(db) as st:
        (run,) = st.runs()
        cells = st.cells(run.id)
    assert (run.cells, run.failed) == (3, 1)
    # the floor first; the two failed cells measured again after it, in the round's order
    assert [c.key.split("|")[0] for c in cells] == ["host/bare-metal", "nbd/raw-off/none/native", "nbd/qcow2-off/none/native"]
    assert started == ["raw", "qcow2", "raw", "qcow2"]
    floor, raw, qcow2 = cells
    assert floor.attempts == 1 and floor.first_error is None
    assert raw.status == "ok" and raw.attempts == 2 and "qemu-storage-daemon refused" in (raw.first_error or "")
    assert raw.metrics["iops"] > 0 and raw.metrics["pct_of_bare_metal"] > 0
    assert 50 < raw.metrics["unallocated_write_pct"] <= 100  # a fresh image for the retry, measured as its round was
    assert qcow2.status == "error" and qcow2.attempts == 2 and "qemu-storage-daemon refused" in (qcow2.error or "")
    assert "qemu-storage-daemon refused" in (qcow2.first_error or "")
    lines = err.splitlines()
    assert any("nbd/raw-off/none/native randwrite-4k:" in ln and "(retried: the first try failed: qemu-storage-daemon"
               in ln for ln in lines), err
    assert any("nbd/qcow2-off/none/native randwrite-4k: ERROR:" in ln and "(retried: the first try failed too:" in ln
               for ln in lines), err
