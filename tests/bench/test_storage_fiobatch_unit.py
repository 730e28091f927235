"""One fio process for a round of block-tier cells (issue 22's wall-time goal): the order, the time
stamps fio writes for each job, the overlap check, and which cells may share a process."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvmtune.bench.storage.block import leaves_dirty, round_order
from kvmtune.bench.storage.matrix import StorageConfig
from kvmtune.lab.storage import fiobatch
from kvmtune.lab.storage.fiobatch import BatchJob, JobTimes


def test_each_job_starts_once_the_previous_one_has_ended_and_stamps_its_start_and_end() -> None:
    jobs = [BatchJob("c0", ("--rw=randwrite",), 5.5), BatchJob("c1", ("--rw=randwrite",), 5.5), BatchJob("c2", (), 1.0)]
    argv = fiobatch.batch_argv(jobs)
    # every job after the first waits for all before it to exit (issue 50): no start on a schedule
    assert argv.count("--stonewall") == 2 and not any(a.startswith("--startdelay") for a in argv)
    assert argv.index("--name=c0") < argv.index("--name=c1") < argv.index("--stonewall") < argv.index("--name=c2")
    assert argv.count(f"--exec_prerun={fiobatch.STAMP}") == 3 and argv.count(f"--exec_postrun={fiobatch.STAMP}") == 3
    # a job's own options follow its --name, so that fio gives them to that job only
    assert argv.index("--name=c1") < argv.index("--rw=randwrite", argv.index("--name=c1")) < argv.index("--name=c2")
    assert fiobatch.planned_seconds(jobs, gap=0.3) == pytest.approx(12.6)


@pytest.mark.parametrize("name", ["../x", "a b", "", "c0;rm"])
def test_a_job_name_is_a_plain_file_name(name: str) -> None:
    with pytest.raises(ValueError, match="plain file name"):
        BatchJob(name, (), 1.0)


def test_stamps_are_read_and_a_job_without_both_is_left_out(tmp_path: Path) -> None:
    (tmp_path / "c0.prerun.txt").write_text("1795500000.100000000\n")
    (tmp_path / "c0.postrun.txt").write_text("1795500005.600000000\n")
    (tmp_path / "c1.prerun.txt").write_text("1795500005.700000000\n")  # fio was killed: no end
    (tmp_path / "c2.prerun.txt").write_text("sh: date: not found\n")
    (tmp_path / "c2.postrun.txt").write_text("1795500011.0\n")
    times = fiobatch.read_times(tmp_path, ["c0", "c1", "c2", "c3"])
    assert times == {"c0": JobTimes(1795500000.1, 1795500005.6)}


def test_a_job_that_started_before_the_previous_one_ended_is_an_overlap() -> None:
    names = ["c0", "c1", "c2", "c3"]
    times = {"c0": JobTimes(0.0, 5.5), "c1": JobTimes(5.6, 11.0), "c2": JobTimes(10.9, 16.0), "c3": JobTimes(15.0, 16.5)}
    assert fiobatch.overlap_s(times, names, "c0") == 0.0
    assert fiobatch.overlap_s(times, names, "c1") == 0.0
    assert fiobatch.overlap_s(times, names, "c2") == pytest.approx(0.1)
    assert fiobatch.overlap_s(times, names, "c3") == pytest.approx(1.0)  # any job before it counts


def cfg(cache: str, **kw: str) -> StorageConfig:
    return StorageConfig(bus="nbd", cache=cache, aio="threads", tier="block", **kw)


def test_cells_that_leave_dirty_pages_run_last_in_the_round_and_the_floor_first() -> None:
    floor = StorageConfig(bus="none", target="host", tier="block", cache="none", aio="native")
    given = [floor, cfg("writeback", fmt="qcow2"), cfg("none", fmt="raw"), cfg("unsafe"), cfg("writethrough")]
    ordered = round_order(given)
    assert [c.cache for c in ordered] == ["none", "none", "writethrough", "writeback", "unsafe"]
    assert ordered[0] is floor
    assert [leaves_dirty(c) for c in ordered] == [False, False, False, True, True]
    assert not leaves_dirty(cfg("directsync"))
