"""Host counters: /proc/diskstats as iostat reads it, process CPU, device lookup."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvmtune.bench.storage.hostio import (
    HostSampler,
    Snapshot,
    device_of_path,
    parse_diskstats,
    process_cpu_s,
    scheduler_of,
    tps,
    write_kBps,
)
from kvmtune.host.root import HostRoot

# kernel 6.x lines: 20 fields (discards and flushes present), and an old 14-field line
DISKSTATS = """ 254       0 vda 1000 10 80000 500 2000 20 160000 900 0 1200 1400 30 0 240 5 40 7
 254       1 vda1 900 10 70000 400 1900 20 150000 800 0 1100 1300 0 0 0 0 0 0
   7       0 loop0 5 0 40 1 6 0 48 1 0 2 2
"""


def test_parse_diskstats_and_iostat_tps() -> None:
    d = parse_diskstats(DISKSTATS)
    assert d["vda"].reads == 1000 and d["vda"].writes == 2000 and d["vda"].discards == 30
    assert d["vda"].flushes == 40
    assert d["vda"].ios == 3030  # iostat: reads + writes + discards, not flushes
    assert d["loop0"].discards == 0 and d["loop0"].sectors_written == 48
    later = parse_diskstats(DISKSTATS.replace("1000 10 80000", "1100 10 80800").replace("2000 20 160000", "2300 20 162048"))
    a, b = Snapshot(10.0, d["vda"], None), Snapshot(12.0, later["vda"], None)
    assert tps(a, b) == pytest.approx((100 + 300) / 2.0)
    assert write_kBps(a, b) == pytest.approx(2048 * 512 / 1024 / 2.0)
    assert tps(a, Snapshot(12.0, None, None)) is None


def test_device_of_a_real_path_is_in_diskstats_or_none() -> None:
    host = HostRoot()
    dev = device_of_path(host, str(Path.cwd()))
    if dev is not None:  # overlay/tmpfs roots have no block device
        assert dev in parse_diskstats(host.read_text("/proc/diskstats"))


def test_process_cpu_of_ourselves_grows() -> None:
    host = HostRoot()
    a = process_cpu_s(host, os.getpid())
    sum(i * i for i in range(300_000))
    b = process_cpu_s(host, os.getpid())
    assert a is not None and b is not None and b >= a
    assert process_cpu_s(host, 2**22 + 7) is None


def test_scheduler_from_a_fixture_tree(tmp_path: Path) -> None:
    q = tmp_path / "sys" / "block" / "vda" / "queue"
    q.mkdir(parents=True)
    (q / "scheduler").write_text("none [mq-deadline] bfq\n")
    host = HostRoot(str(tmp_path))
    assert scheduler_of(host, "vda") == "mq-deadline"
    assert scheduler_of(host, "vda1") == "mq-deadline"  # a partition falls back to its disk
    assert scheduler_of(host, None) is None


def test_sampler_series_from_a_fixture_tree(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "diskstats").write_text(DISKSTATS)
    s = HostSampler(HostRoot(str(tmp_path)), "vda", None, interval=0.01)
    s.start()
    s.stop()
    assert len(s.series) >= 2 and all(x.disk is not None and x.disk.ios == 3030 for x in s.series)
