"""The replay job builder (lab/storage/replay.py): a captured workload file is another host's file — hostile input.

Each test goes through the real path: the workload file written to disk, read by capture/workload.py's reader
(``read_workload``, as the CLI does), turned into a replay by ``build_replay``, its options built for fio."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from kvmtune.capture.trace import Request
from kvmtune.capture.workload import SCHEMA, StatsDelta, from_stats, from_trace, iolog, read_workload
from kvmtune.errors import InputError
from kvmtune.lab.storage.replay import (
    LOG_NAME,
    MAX_FLUSH_PER_WRITE,
    SYNTHESIZED,
    build_replay,
    fio_syncs_after_reads,
    read_iolog,
)
from kvmtune.qemuopts import OptionError, fio_bssplit, fio_counts

# every fio option a replay may hand fio: nothing else, whatever the file says
ALLOWED = {"read_iolog", "iodepth", "runtime", "size", "replay_no_stall", "rw", "rwmixread", "bssplit", "bs",
           "percentage_random", "rate_iops", "rate", "fsync", "time_based", "name", "group_reporting"}


def reqs(n: int, write_every: int = 3, base: int = 5 << 30) -> list[Request]:
    return [Request(i * 0.002, i * 0.002 + 0.004, 1, i % write_every == 0, base + (i * 7919 % 1000) * 16384, 16384)
            for i in range(n)]


def write_capture(tmp: Path, *, trace: bool = True, with_log: bool = True, n: int = 300) -> Path:
    r = reqs(n)
    rd, wr = sum(not x.write for x in r), sum(x.write for x in r)
    stats = StatsDelta(n * 0.002, rd_ops=rd, wr_ops=wr, flush_ops=10, rd_bytes=rd * 16384, wr_bytes=wr * 16384)
    disk = from_trace("vda", r, stats) if trace else from_stats("vda", stats, [stats])
    path = tmp / "w.json"
    path.write_text(json.dumps({"schema": SCHEMA, "guest": "g", "captured_at": "2026-12-03T00:00:00Z",
                                "disks": [disk]}))
    if trace and with_log:
        (tmp / "w.json.iolog").write_text(iolog("vda", r))
    return path


def replay_of(path: Path, **kw: Any) -> Any:
    doc, digest = read_workload(str(path))
    return build_replay(doc, digest, path, **kw)


def options(args: list[str]) -> dict[str, str]:
    out = {}
    for a in args:
        m = re.fullmatch(r"--([a-z_]+)(?:=(.*))?", a)
        assert m, a
        out[m.group(1)] = m.group(2) or ""
    return out


def test_a_traced_disk_replays_its_log_translated_to_microseconds_rebased_and_renamed(tmp_path: Path) -> None:
    path = write_capture(tmp_path)
    rep = replay_of(path, mode="timed")
    assert rep.source == "iolog" and rep.record()["digest"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert rep.base == 5 << 30  # the lowest offset, rounded down to 2 MiB
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    rep.prepare(scratch)
    lines = (scratch / f"{LOG_NAME}.iolog").read_text().splitlines()
    assert lines[:3] == ["fio version 3 iolog", f"1 {LOG_NAME} add", f"1 {LOG_NAME} open"]
    # timed: dealt round-robin into as many depth-1 jobs as the captured depth (p95 2 here), at the captured times
    assert rep.streams() == 2
    other = (scratch / f"{LOG_NAME}-1.iolog").read_text().splitlines()
    first, second = lines[3].split(), lines[4].split()
    assert first[0] == "1" and second[0] == "4001"  # requests 0 and 2, 2 ms apart in the capture each: µs, +1
    assert other[3].split()[0] == "2001"  # request 1, on the second stream
    assert int(first[3]) == 0 and first[2] == "write"
    ios = sorted((int(x.split()[0]), x.split()[2], int(x.split()[3])) for x in [*lines, *other]
                 if x.split()[2] in ("read", "write"))
    assert len(ios) == 300 and len({t for t, _, _ in ios}) == 300  # every request once
    argv = rep.job_options(rep.replica_mib(64), 5)
    assert argv.count(f"--read_iolog={scratch / f'{LOG_NAME}.iolog'}") == 1
    assert argv.count(f"--read_iolog={scratch / f'{LOG_NAME}-1.iolog'}") == 1
    assert argv.count("--iodepth=1") == 2 and "--group_reporting" in argv and "--replay_no_stall=1" not in argv
    opts = options(argv)
    assert opts["iodepth"] == "1"  # each job at depth 1: fio reaps a replay's completions only with a full queue
    assert rep.replica_mib(64) == 64 and rep.replica_mib(1) == 16  # the span (999 × 16 KiB + 16 KiB) in MiB
    fast = replay_of(path, mode="fast")
    fast.prepare(tmp_path)
    fo = options(fast.job_options(64, 5))
    assert "replay_no_stall" in fo and fo["iodepth"] == "2"  # the captured depth (p95) at full speed


def test_statistics_give_a_synthesized_job_and_say_so(tmp_path: Path) -> None:
    path = write_capture(tmp_path, with_log=False)
    rep = replay_of(path, mode="timed")
    assert rep.source == "statistics" and rep.record()["synthesized"] is True
    assert any(SYNTHESIZED in n for n in rep.notes) and SYNTHESIZED in rep.label
    opts = options(rep.job_options(64, 5))
    assert opts["rw"] == "randrw" and opts["rwmixread"] == "67"
    assert opts["bs"] == "16384" and "bssplit" not in opts and opts["percentage_random"] == "100"
    r, w = (int(x) for x in opts["rate_iops"].split(","))
    assert r + w == pytest.approx(500, abs=2) and r == pytest.approx(2 * w, abs=2)
    assert opts["fsync"] == "10" and opts["iodepth"] == "2"  # 10 flushes per 100 writes
    fast = options(replay_of(path, mode="fast").job_options(64, 5))
    assert "rate_iops" not in fast and "time_based" in fast
    stats = replay_of(write_capture(tmp_path, trace=False))
    so = options(stats.job_options(64, 5))
    assert "bssplit" not in so and so["bs"] == "16384" and "percentage_random" not in so  # order not known


def test_a_split_of_sizes_is_rated_in_bytes_as_fio_rates_iops_by_the_smallest_size(tmp_path: Path) -> None:
    path = write_capture(tmp_path, with_log=False)
    doc = json.loads(path.read_text())
    doc["disks"][0]["size_bytes"]["histogram"] = {"4096": 100, "16384": 200}
    path.write_text(json.dumps(doc))
    opts = options(replay_of(path, mode="timed").job_options(64, 5))
    assert opts["bssplit"] == "4096/33:16384/67" and "rate_iops" not in opts
    r, w = (int(x) for x in opts["rate"].split(","))
    mean = (4096 * 33 + 16384 * 67) / 100
    assert (r + w) / mean == pytest.approx(500, rel=0.01)


def test_every_option_is_from_the_allow_list_whatever_the_file_holds(tmp_path: Path) -> None:
    path = write_capture(tmp_path, with_log=False)
    doc = json.loads(path.read_text())
    d = doc["disks"][0]
    d["size_bytes"]["histogram"] = {"512": 3, "67108864": 1, "4096": 10**12}
    d["queue_depth"] = {"mean": 1e6, "p95": 1e6}
    d["flush_per_write"] = 1e-9
    d["iops"] = 1e9
    path.write_text(json.dumps(doc))
    for mode in ("timed", "fast"):
        opts = options(replay_of(path, mode=mode).job_options(64, 5))
        assert set(opts) <= ALLOWED
        assert opts["iodepth"] == "256" and int(opts["fsync"]) <= 1 << 20


@pytest.mark.parametrize("mutate, words", [
    (lambda d: d.update(schema="kvmtune-workload/2"), "schema"),
    (lambda d: d["disks"][0].update(iops=1e300), "iops"),
    (lambda d: d["disks"][0].update(iops=10**400), "iops"),  # an integer no float holds (OverflowError before)
    (lambda d: d["disks"][0]["queue_depth"].update(mean=-(10**400)), "queue_depth.mean"),
    (lambda d: d["disks"][0].update(offset_span_bytes=-4096), "offset_span_bytes"),
    (lambda d: d["disks"][0]["size_bytes"]["histogram"].update({"../../etc/passwd": 1}), "bucket"),
    (lambda d: d["disks"][0]["ops"].update(read=True), "ops.read"),
])
def test_a_bad_workload_file_is_one_line_naming_it(tmp_path: Path, mutate: Any, words: str) -> None:
    path = write_capture(tmp_path)
    doc = json.loads(path.read_text())
    mutate(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError) as exc:
        replay_of(path)
    assert str(path) in str(exc.value) and words in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("value", [10**400, -(10**400), float("nan"), float("inf")], ids=["huge", "-huge", "nan", "inf"])
def test_the_replay_checks_each_figure_again_whatever_reached_it(tmp_path: Path, value: Any) -> None:
    """The replay reads a document its reader has checked, and checks each figure it turns into an option again
    (lab/ trusts nothing of capture/): an integer too large for a float is one line, not an OverflowError."""
    path = write_capture(tmp_path)
    doc, digest = read_workload(str(path))
    doc["disks"][0]["iops"] = value
    with pytest.raises(InputError, match="iops is not a number"):
        build_replay(doc, digest, path)


@pytest.mark.parametrize("raw", [b'{"schema": NaN}', b'{"schema": "a", "schema": "b"}', b"\xff\xfe", b"[" * 100000])
def test_nan_duplicate_keys_and_non_text_are_refused(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "w.json"
    path.write_bytes(raw)
    with pytest.raises(InputError):
        replay_of(path)


def test_a_replica_too_large_for_the_log_is_refused_and_a_huge_statistical_span_capped(tmp_path: Path) -> None:
    path = write_capture(tmp_path)
    (tmp_path / "w.json.iolog").write_text("fio version 3 iolog\n0 d add\n0 d open\n0 d read 0 4096\n"
                                           f"1 d write {1 << 47} 4096\n1 d close\n")
    with pytest.raises(InputError, match="more than"):
        replay_of(path).replica_mib(64)
    (tmp_path / "w.json.iolog").unlink()
    doc = json.loads(path.read_text())
    doc["disks"][0]["offset_span_bytes"] = 1 << 60
    path.write_text(json.dumps(doc))
    rep = replay_of(path)
    assert rep.replica_mib(64) == 64 << 10 and any("capped" in n for n in rep.notes)


BAD_LOGS = {
    "no header": "0 d add\n",
    "v2 header": "fio version 2 iolog\nd add\n",
    "path traversal": "fio version 3 iolog\n0 ../../etc/shadow add\n0 ../../etc/shadow read 0 4096\n",
    "absolute path": "fio version 3 iolog\n0 /dev/sda read 0 4096\n",
    "two files": "fio version 3 iolog\n0 a read 0 4096\n1 b read 0 4096\n",
    "negative offset": "fio version 3 iolog\n0 d read -4096 4096\n",
    "zero length": "fio version 3 iolog\n0 d read 0 0\n",
    "huge length": f"fio version 3 iolog\n0 d read 0 {1 << 30}\n",
    "huge offset": f"fio version 3 iolog\n0 d read {1 << 60} 4096\n",
    "CRLF": "fio version 3 iolog\r\n0 d read 0 4096\r\n",
    "CR only": "fio version 3 iolog\n0 d read 0 4096\r1 d read 0 4096\n",
    "U+2028": "fio version 3 iolog\n0 d read 0 4096\u20281 d read 0 4096\n",
    "vertical tab": "fio version 3 iolog\n0 d read 0 4096\x0b\n",
    "tab": "fio version 3 iolog\n0\td read 0 4096\n",
    "two spaces": "fio version 3 iolog\n0 d  read 0 4096\n",
    "trailing text": "fio version 3 iolog\n0 d read 0 4096 --exec_prerun=x\n",
    "an option as action": "fio version 3 iolog\n0 d trim 0 4096\n",
    "time goes back": "fio version 3 iolog\n5 d read 0 4096\n4 d read 0 4096\n",
    "past a day": f"fio version 3 iolog\n{86_400_000_001} d read 0 4096\n",
    "nothing to replay": "fio version 3 iolog\n0 d add\n0 d open\n",
    "a glob": "fio version 3 iolog\n0 * read 0 4096\n",
}


@pytest.mark.parametrize("name", sorted(BAD_LOGS))
def test_a_hostile_iolog_is_refused_whole_with_one_line(tmp_path: Path, name: str) -> None:
    path = write_capture(tmp_path)
    (tmp_path / "w.json.iolog").write_bytes(BAD_LOGS[name].encode())
    with pytest.raises(InputError) as exc:
        replay_of(path)
    assert "w.json.iolog" in str(exc.value) and "\n" not in str(exc.value)


def test_the_iolog_is_never_a_link_or_another_kind_of_file(tmp_path: Path) -> None:
    path = write_capture(tmp_path, with_log=False)
    other = tmp_path / "elsewhere.iolog"
    other.write_text(iolog("vda", reqs(10)))
    (tmp_path / "w.json.iolog").symlink_to(other)
    with pytest.raises(InputError, match="symbolic link"):
        replay_of(path)
    (tmp_path / "w.json.iolog").unlink()
    os.mkfifo(tmp_path / "w.json.iolog")
    with pytest.raises(InputError):
        read_iolog(tmp_path / "w.json.iolog")


def test_the_translated_log_is_written_only_in_the_given_directory_never_over_a_file(tmp_path: Path) -> None:
    path = write_capture(tmp_path)
    rep = replay_of(path)
    scratch = tmp_path / "s"
    scratch.mkdir()
    (scratch / f"{LOG_NAME}.iolog").symlink_to(tmp_path / "victim")
    with pytest.raises(FileExistsError):
        rep.prepare(scratch)
    assert not (tmp_path / "victim").exists()


def test_mode_and_disk_are_checked(tmp_path: Path) -> None:
    path = write_capture(tmp_path)
    with pytest.raises(InputError, match="replay-mode"):
        replay_of(path, mode="turbo")
    with pytest.raises(InputError, match="replay-disk"):
        replay_of(path, disk="vdb")
    doc = json.loads(path.read_text())
    doc["disks"].append(dict(doc["disks"][0], target="vdb"))
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="2 disks"):
        replay_of(path)
    rep = replay_of(path, disk="vdb")
    assert rep.source == "statistics" and any("first disk only" in n for n in rep.notes)


def test_the_option_builders_take_counts_only() -> None:
    assert fio_counts("rate_iops", [700, 300]) == "--rate_iops=700,300"
    assert fio_bssplit([(4096, 60), (65536, 40)]) == "--bssplit=4096/60:65536/40"
    for bad in ([-1], ["1,2"], [True], [1.5]):
        with pytest.raises(OptionError):
            fio_counts("rate_iops", bad)  # type: ignore[arg-type]
    for entries in ([(0, 100)], [(4096, 101)], [("4k", 50)], [(1 << 40, 1)], []):
        with pytest.raises(OptionError):
            fio_bssplit(entries)  # type: ignore[arg-type]
    with pytest.raises(OptionError):
        fio_counts("rate_iops;x", [1])


def test_a_replay_that_reads_gets_its_image_written_whole_first_and_a_write_only_one_does_not(tmp_path: Path) -> None:
    from kvmtune.bench.storage.blockjobs import filled_first
    from kvmtune.lab.storage.fio import Workload

    mixed = replay_of(write_capture(tmp_path))
    mixed.place(tmp_path)
    assert mixed.reads() and filled_first(mixed.workload(16, 1.0))  # reads of holes would not be reads
    (tmp_path / "w").mkdir()
    writes = replay_of(write_capture(tmp_path / "w", trace=False))  # statistics: 1 in 3 written, so it reads too
    assert writes.reads()
    only = tmp_path / "o"
    only.mkdir()
    r = [x for x in reqs(300) if x.write]
    stats = StatsDelta(0.6, wr_ops=len(r), wr_bytes=len(r) * 16384)
    (only / "w.json").write_text(json.dumps({"schema": SCHEMA, "guest": "g", "captured_at": "2026-12-03T00:00:00Z",
                                             "disks": [from_trace("vda", r, stats)]}))
    (only / "w.json.iolog").write_text(iolog("vda", r))
    wo = replay_of(only / "w.json")
    wo.place(only)
    assert not wo.reads() and not filled_first(wo.workload(16, 1.0))  # writes land on fresh clusters, as bench's do
    # the generic jobs keep their rule: a read job is filled, a write or mixed one measures a fresh image
    assert filled_first(Workload("r", "randread", "4k", 1)) and not filled_first(Workload("m", "randrw", "4k", 1))


def _syncs_follow_writes(lines: list[str]) -> int:
    """The sync lines of a translated log, each checked to follow a write (or another sync) at the same stamp."""
    syncs = 0
    for prev, line in itertools.pairwise(lines):
        if line.split()[2] == "sync":
            assert line.split()[3:] == ["0", "0"]
            assert prev.split()[2] in ("write", "sync") and prev.split()[0] == line.split()[0], (prev, line)
            syncs += 1
    return syncs


def test_the_captured_flushes_are_replayed_as_syncs_after_writes_and_fio_sends_them(tmp_path: Path) -> None:
    # the capture: 100 writes of 300 requests and 10 flushes (blockstats): 0.1 a write, none in the log itself
    path = write_capture(tmp_path)
    doc, _ = read_workload(str(path))
    assert doc["disks"][0]["flush_per_write"] == pytest.approx(0.1)
    rep = replay_of(path, mode="timed")
    assert any("the log has no flushes: 0.1 a write" in n for n in rep.notes)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    rep.prepare(scratch)
    logs = [p.read_text().splitlines() for p in rep.log_paths()]
    assert len(logs) == 2
    assert sum(_syncs_follow_writes(lines) for lines in logs) == 10
    assert sum(1 for lines in logs for x in lines if x.split()[2] in ("read", "write")) == 300
    # fio (the installed one, as the replay runs it) reads the lines and sends the syncs: psync on a plain file here
    fio = shutil.which("fio")
    if fio is None:
        pytest.skip("fio is not installed")
    first = rep.log_paths()[0]
    work = tmp_path / "fio"
    work.mkdir()
    with (work / LOG_NAME).open("wb") as fh:
        fh.truncate(rep.replica_mib(64) << 20)
    done = subprocess.run([fio, "--name=check", f"--read_iolog={first}", "--ioengine=psync", "--replay_no_stall=1",
                           "--output-format=json"], cwd=work, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout[done.stdout.index("{"):])["jobs"][0]
    assert job["sync"]["total_ios"] == _syncs_follow_writes(logs[0]) > 0


def test_a_statistics_only_log_gets_no_syncs_and_a_foreign_flush_figure_is_bounded(tmp_path: Path) -> None:
    path = write_capture(tmp_path)
    doc = json.loads(path.read_text())
    doc["disks"][0]["flush_per_write"] = 0.0
    path.write_text(json.dumps(doc))
    rep = replay_of(path, mode="fast")
    rep.prepare(tmp_path)
    assert _syncs_follow_writes(rep.log_paths()[0].read_text().splitlines()) == 0
    # another host's file says a billion flushes a write: at most MAX_FLUSH_PER_WRITE lines after each write
    other = tmp_path / "other"
    other.mkdir()
    path2 = write_capture(other)
    doc2 = json.loads(path2.read_text())
    doc2["disks"][0]["flush_per_write"] = 1e9
    path2.write_text(json.dumps(doc2))
    rep2 = replay_of(path2, mode="fast")
    assert any(f"the log has no flushes: {MAX_FLUSH_PER_WRITE:g} a write" in n for n in rep2.notes)
    scratch = other / "scratch"
    scratch.mkdir()
    rep2.prepare(scratch)
    lines = rep2.log_paths()[0].read_text().splitlines()
    assert _syncs_follow_writes(lines) == 100 * MAX_FLUSH_PER_WRITE


@pytest.mark.parametrize(("version", "old"), [("fio-3.33\n", True), ("fio-3.37", True), ("fio-3.38", False),
                                              ("fio-3.40-12-gabcdef", False), (None, False), ("", False),
                                              ("fio-3.33; rm -rf /", False), ("fio-2.2\n", True)])
def test_which_fio_syncs_after_reads_too(version: str | None, old: bool) -> None:
    assert fio_syncs_after_reads(version) is old


def test_a_synthesized_mixed_job_asks_an_old_fio_for_its_syncs_as_it_counts_them(tmp_path: Path) -> None:
    # statistics: 200 reads, 100 writes, 10 flushes: 0.1 a write
    path = write_capture(tmp_path, trace=False)
    rep = replay_of(path, mode="fast")
    assert options(rep.job_options(64, 1))["fsync"] == "10"
    rep.use_fio("fio-3.33")
    assert options(rep.job_options(64, 1))["fsync"] == "30"  # 0.1 × (1 − 2/3): fio 3.33 sends 3× per fsync=N
    assert any("fixed in fio 3.38" in n for n in rep.notes)
    rep.use_fio("fio-3.39")
    assert options(rep.job_options(64, 1))["fsync"] == "10"
    # the installed fio, asked through the runner as bench and verify ask it, sends the captured 0.1 a write
    fio = shutil.which("fio")
    if fio is None:
        pytest.skip("fio is not installed")
    from kvmtune.runner import Runner

    rep.use_fio_of(Runner())
    with tempfile.TemporaryDirectory(prefix="kvmtune-test-fsync-", dir="/dev/shm") as shm:  # a second of it
        done = subprocess.run([fio, "--name=check", f"--filename={shm}/f", "--ioengine=libaio",
                               *rep.job_options(16, 1), "--output-format=json"],
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout[done.stdout.index("{"):])["jobs"][0]
    per_write = job["sync"]["total_ios"] / job["write"]["total_ios"]
    assert 0.08 <= per_write <= 0.12, per_write
