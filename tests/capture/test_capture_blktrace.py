"""``capture --source blktrace``: the block device under a disk traced with blktrace, its records read by the real
``blkparse``. This machine's kernel refuses real traces (kernel_lockdown(7) restricts blktrace's debugfs files), so
``tests/capture/standins/blktrace.py`` stands in for ``blktrace`` alone: it writes records in blktrace's binary
format, which the real blkparse parses. The QEMU is this test process with a QMP that answers blockstats and
query-block (as the hostile tests' is)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from kvmtune.capture import blktrace as bt
from kvmtune.capture.session import Capture, restore_leftovers
from kvmtune.capture.workload import from_trace
from kvmtune.errors import KvmtuneError
from kvmtune.host.root import HostRoot
from kvmtune.runner import Runner

STANDIN = Path(__file__).resolve().parent / "standins" / "blktrace.py"
DEVICE = "/dev/loop0"  # only ever stat()ed: the stand-in traces nothing
pytestmark = pytest.mark.skipif(shutil.which("blkparse") is None or not os.access(DEVICE, os.R_OK),
                                reason="needs blkparse (Debian blktrace) and a /dev/loop0 node it may open")


@pytest.fixture(autouse=True)
def holds_device() -> Any:
    """This process stands in for the QEMU: it holds its disk's device open, as a QEMU holds its image (a device
    the QEMU does not hold is not traced)."""
    fd = os.open(DEVICE, os.O_RDONLY | os.O_CLOEXEC)
    yield
    os.close(fd)


class Qmp:
    """A guest's QMP with one disk d0 on ``file``: blockstats zero for the capture's first two reads, then
    ``totals``."""

    def __init__(self, totals: dict[str, int], file: str = DEVICE) -> None:
        self.totals, self.file, self.reads = totals, file, 0
        self.sent: list[str] = []

    def execute(self, cmd: str, **args: Any) -> Any:
        self.sent.append(cmd)
        if cmd == "query-blockstats":
            self.reads += 1
            st = self.totals if self.reads > 2 else {k: 0 for k in self.totals}
            return [{"device": "d0", "qdev": "/machine/peripheral/d0/virtio-backend", "stats": dict(st)}]
        if cmd == "query-block":
            return [{"device": "d0", "qdev": "/machine/peripheral/d0/virtio-backend", "inserted": {"file": self.file}}]
        return {}

    def close(self) -> None:
        pass


def me() -> dict[str, Any]:
    from kvmtune.capture.session import identity
    ident = identity(HostRoot(), os.getpid())
    assert ident is not None
    return ident


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in first on PATH, a host tree whose /proc/mounts has debugfs; the call log's path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "blktrace").write_text(f'#!/bin/sh\nexec {sys.executable} {STANDIN} "$@"\n')
    (bin_dir / "blktrace").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    log = tmp_path / "blktrace.log"
    monkeypatch.setenv("KVMTUNE_BLKTRACE_LOG", str(log))
    return log


def mounts(tmp_path: Path, debugfs: bool = True) -> HostRoot:
    root = tmp_path / "host"
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "mounts").write_text("proc /proc proc rw 0 0\n" + (
        "debugfs /sys/kernel/debug debugfs rw,nosuid 0 0\n" if debugfs else ""))
    return HostRoot(str(root))


# 16 KiB reads at depth 2 and 4 KiB writes, then a flush without data and a discard (not requests of the mix)
RECORDS = [[0.000, "D", "R", 2048, 16384], [0.0001, "D", "R", 4096, 16384], [0.0005, "C", "R", 2048, 16384],
           [0.0006, "C", "R", 4096, 16384], [0.0010, "D", "WS", 8192, 4096], [0.0015, "C", "WS", 8192, 4096],
           [0.0020, "D", "R", 2080, 16384], [0.0030, "C", "R", 2080, 16384], [0.0040, "D", "FN", 0, 0],
           [0.0041, "C", "FN", 0, 0], [0.0050, "D", "D", 100, 65536], [0.0051, "C", "D", 100, 65536]]
TOTALS = {"rd_operations": 3, "wr_operations": 1, "flush_operations": 1, "unmap_operations": 1,
          "rd_bytes": 3 * 16384, "wr_bytes": 4096, "rd_total_time_ns": 0, "wr_total_time_ns": 0}


def test_the_device_requests_become_the_disks_workload_and_nothing_is_left(
        tmp_path: Path, standin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVMTUNE_BLKTRACE_RECORDS", json.dumps(RECORDS))
    cap = Capture(HostRoot(), os.getpid(), tmp_path, seconds=0.01, trace=False, tick=lambda s: None,
                  blktrace=bt.BlkTrace(mounts(tmp_path), Runner()))
    result = cap._run(Qmp(TOTALS), me())
    assert result.per_request_source == "blktrace" and result.why_not_trace == ""
    assert result.requests is not None
    reqs = result.requests["d0"]
    assert [(r.write, r.offset, r.size) for r in reqs] == [(False, 2048 * 512, 16384), (False, 4096 * 512, 16384),
                                                           (True, 8192 * 512, 4096), (False, 2080 * 512, 16384)]
    assert all(r.t_done is not None and r.t_done > r.t_submit for r in reqs)
    d = from_trace("d0", reqs, result.stats["d0"], source=result.per_request_source)
    assert d["source"] == "blktrace" and d["read_fraction"] == 0.75 and d["ops"]["flush"] == 1
    calls = [json.loads(x) for x in standin.read_text().splitlines()]
    assert calls[0][:2] == ["-d", DEVICE] and calls[0][2] == "-D"
    assert not Path(calls[0][3]).exists()  # the scratch directory is gone
    assert not list(tmp_path.glob("capture-active-*.json"))


def test_requests_that_are_not_the_disks_are_refused_with_why(
        tmp_path: Path, standin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process's I/O on the device (twice the disk's requests): not put on the disk."""
    monkeypatch.setenv("KVMTUNE_BLKTRACE_RECORDS", json.dumps(RECORDS + [[0.006 + i / 1e4, a, "W", 50_000 + i, 4096]
                                                                       for i in range(8) for a in "DC"]))
    cap = Capture(HostRoot(), os.getpid(), tmp_path, seconds=0.01, trace=False, tick=lambda s: None,
                  blktrace=bt.BlkTrace(mounts(tmp_path), Runner()))
    result = cap._run(Qmp(TOTALS), me())
    assert result.requests is None
    assert f"{DEVICE} saw 12 requests" in result.why_not_trace and "another process uses the device" in \
        result.why_not_trace


def test_a_kernel_that_refuses_the_trace_is_one_line_and_the_guest_is_left_as_it_was(
        tmp_path: Path, standin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVMTUNE_BLKTRACE_FAIL", "Thread 0 failed open /sys/kernel/debug/block/loop0/trace0: "
                                                "1/Operation not permitted")
    qmp = Qmp(TOTALS)
    cap = Capture(HostRoot(), os.getpid(), tmp_path, seconds=0.01, trace=False, tick=lambda s: None,
                  blktrace=bt.BlkTrace(mounts(tmp_path), Runner()))
    with pytest.raises(KvmtuneError, match=r"blktrace could not trace /dev/loop0: Thread 0 failed open .*"
                                           r"Operation not permitted \(kernel_lockdown"):
        cap._run(qmp, me())
    assert not list(tmp_path.glob("capture-active-*.json"))
    assert qmp.sent.count("block-latency-histogram-set") == 2  # set, and restored


@pytest.mark.parametrize(("debugfs", "file", "why"), [
    (False, DEVICE, "debugfs is not mounted at /sys/kernel/debug"),
    (True, "/var/lib/libvirt/images/web.qcow2", "is not a block device under /dev"),
    (True, "/dev/../etc/passwd", "is not a block device under /dev"),
    (True, "/dev/-k", "cannot be looked at"),
    (True, "/dev/null", "/dev/null is not a block device"),
    (True, "/dev/x\nrm -rf", "is not a block device under /dev"),
])
def test_what_stops_blktrace_is_said_before_anything_changes(
        tmp_path: Path, standin: Path, debugfs: bool, file: str, why: str) -> None:
    qmp = Qmp(TOTALS, file=file)
    cap = Capture(HostRoot(), os.getpid(), tmp_path, seconds=0.01, trace=False, tick=lambda s: None,
                  blktrace=bt.BlkTrace(mounts(tmp_path, debugfs), Runner()))
    with pytest.raises(KvmtuneError, match="--source blktrace refused") as exc:
        cap._run(qmp, me())
    assert why in str(exc.value)
    assert not standin.exists()  # blktrace never ran
    assert "block-latency-histogram-set" not in qmp.sent and not list(tmp_path.glob("capture-active-*.json"))


def test_without_blktrace_installed_it_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "not installed" in bt.BlkTrace(mounts(tmp_path), Runner()).why_not()


def test_blkparse_lines_out_of_format_are_skipped_and_counted_and_bounded() -> None:
    text = ("D 0.000000001 R 8 4096\nC 0.000000002 R 8 4096\nD 1.0 R 8 4096\n"
            "D 0.000000003 R 99999999999999999999999 4096\nX 0.000000004 R 8 4096\n\u2028\n"
            "C 0.000000000 W 16 4096\nD 0.000000005 W 16 4096\nD 0.000000006 W 24 4096\n")
    reqs, skipped, _ = bt.parse(text, max_events=2)
    assert [(r.write, r.offset) for r in reqs] == [(False, 8 * 512), (True, 16 * 512)]  # the third past the bound
    assert reqs[0].t_done == 0.000000002 and reqs[1].t_done is None  # a completion before its issue is not its own
    assert skipped == 3  # a lone U+2028 is a line break to splitlines: an empty line, not counted


def test_a_sigkilled_blktrace_capture_is_torn_down_by_the_next_one(tmp_path: Path, standin: Path) -> None:
    """A marker naming a device (and one that names something else) of a capture that no longer runs."""
    marker = tmp_path / "capture-active-5.json"
    marker.write_text(json.dumps({**me(), "pid": 999_999_999, "events": [], "histograms": [],
                                  "blktrace": [DEVICE, "-k", "/etc/passwd", 7]}))
    marker.chmod(0o600)
    lines = restore_leftovers(HostRoot(), tmp_path)
    assert f"blktrace of {DEVICE} torn down" in lines
    assert sum("left alone" in x for x in lines) == 3
    calls = [json.loads(x) for x in standin.read_text().splitlines()]
    assert calls == [["-k", "-d", DEVICE]]


@pytest.fixture
def shm_link() -> Any:
    """A link another user could have made in /dev/shm (world-writable), naming the traced block device now and,
    between kvmtune's check and blktrace's open, anything else (another device, a FIFO, a watchdog)."""
    if not os.path.isdir("/dev/shm") or not os.stat("/dev/shm").st_mode & 0o002:
        pytest.skip("needs a world-writable /dev/shm")
    link = Path(f"/dev/shm/kvmtune-test-{os.getpid()}")
    link.symlink_to(DEVICE)
    yield str(link)
    link.unlink()


def test_a_device_reached_through_a_directory_others_can_write_is_never_given_to_blktrace(
        tmp_path: Path, standin: Path, shm_link: str) -> None:
    """Before, ``/dev/shm/LINK`` passed (it matched the pattern and stat() followed the link to a block device) and
    blktrace, as root, opened whatever the link named by then; a marker naming it got ``blktrace -k`` the same way."""
    qmp = Qmp(TOTALS, file=shm_link)
    cap = Capture(HostRoot(), os.getpid(), tmp_path, seconds=0.01, trace=False, tick=lambda s: None,
                  blktrace=bt.BlkTrace(mounts(tmp_path), Runner()))
    with pytest.raises(KvmtuneError, match="--source blktrace refused") as exc:
        cap._run(qmp, me())
    assert f"its image {shm_link} is reached through /dev/shm, which users other than root can change" in str(exc.value)
    assert not standin.exists()  # blktrace never ran
    marker = tmp_path / "capture-active-5.json"
    marker.write_text(json.dumps({**me(), "pid": 999_999_999, "events": [], "histograms": [], "blktrace": [shm_link]}))
    marker.chmod(0o600)
    lines = restore_leftovers(HostRoot(), tmp_path)
    assert any(shm_link in x and "reached through /dev/shm" in x and x.endswith("left alone") for x in lines), lines
    assert not standin.exists()


def test_blktrace_is_given_the_device_node_the_path_resolves_to(
        tmp_path: Path, standin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What blktrace opens is the node checked (``/dev/loop0``, in /dev, which only root changes), not the path as
    the QMP reply spelled it; the marker names the node too."""
    monkeypatch.setenv("KVMTUNE_BLKTRACE_RECORDS", json.dumps(RECORDS))
    cap = Capture(HostRoot(), os.getpid(), tmp_path, seconds=0.01, trace=False, tick=lambda s: None,
                  blktrace=bt.BlkTrace(mounts(tmp_path), Runner()))
    result = cap._run(Qmp(TOTALS, file="/dev/./loop0"), me())
    assert result.requests is not None and len(result.requests["d0"]) == 4
    calls = [json.loads(x) for x in standin.read_text().splitlines()]
    assert calls[0][:2] == ["-d", DEVICE]


def test_a_capture_that_breaks_off_leaves_no_scratch_directory(
        tmp_path: Path, standin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The guest's monitor gone mid-capture: blktrace is stopped and its records (the device's requests, in the
    scratch directory beside the marker) removed. Before, only a capture that read them did."""
    monkeypatch.setenv("KVMTUNE_BLKTRACE_RECORDS", json.dumps(RECORDS))

    class Gone(Qmp):
        def execute(self, cmd: str, **args: Any) -> Any:
            if cmd == "query-blockstats" and self.reads >= 2:
                raise KvmtuneError("the monitor went away")
            return super().execute(cmd, **args)

    cap = Capture(HostRoot(), os.getpid(), tmp_path, seconds=0.01, trace=False, tick=lambda s: None,
                  blktrace=bt.BlkTrace(mounts(tmp_path), Runner()))
    with pytest.raises(KvmtuneError, match="the capture broke off"):
        cap._run(Gone(TOTALS), me())
    calls = [json.loads(x) for x in standin.read_text().splitlines()]
    scratch = Path(calls[0][3])
    assert calls[0][:2] == ["-d", DEVICE] and scratch.parent == tmp_path
    assert bt._SCRATCH.fullmatch(scratch.name) and not scratch.exists()
    assert not list(tmp_path.glob("capture-active-*"))


KILLED = """
import json, os, sys, time
from pathlib import Path
from kvmtune.capture import blktrace as bt
from kvmtune.runner import Runner
from kvmtune.host.root import HostRoot
t = bt.BlkTrace(HostRoot(), Runner())
t.start([sys.argv[2]], bt.scratch_for(Path(sys.argv[1]) / f"capture-active-{os.getpid()}-0123456789abcdef.json"))
print(t.scratch, flush=True)
time.sleep(60)
"""


def test_a_sigkilled_captures_blktrace_records_are_removed_by_the_next_one(tmp_path: Path, standin: Path) -> None:
    """kill -9 of a capture while blktrace writes: its records stay in the work directory (they were in
    ``/tmp/kvmtune-blktrace-*``, which nothing removed) until the next capture or doctor, which removes them; a
    running capture's directory (its lock held) is left to it."""
    import signal
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(tmp_path), DEVICE], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    scratch = Path(proc.stdout.readline().strip())
    assert scratch.parent == tmp_path and (scratch.stat().st_mode & 0o777) == 0o700
    (scratch / "loop0.blktrace.0").write_bytes(b"records")  # what a real blktrace has written by then
    assert restore_leftovers(HostRoot(), tmp_path) == [] and scratch.is_dir()  # still running: its own
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert restore_leftovers(HostRoot(), tmp_path) == [f"{scratch}: blktrace records of a killed capture removed"]
    assert not scratch.exists()
    assert restore_leftovers(HostRoot(), tmp_path) == []


def test_a_scratch_name_someone_else_prepared_is_neither_followed_nor_emptied(tmp_path: Path) -> None:
    """In a shared work directory another user can leave entries under a scratch directory's name: a link to a
    directory of theirs (or the victim's), a directory of theirs, one anyone may write. None is entered or emptied;
    a capture never traces into a directory it did not create."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("x")
    link = tmp_path / "capture-active-7-0000000000000001.blktrace"
    link.symlink_to(victim)
    open_dir = tmp_path / "capture-active-7-0000000000000002.blktrace"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    (open_dir / "keep").write_text("x")
    theirs = tmp_path / "capture-active-7-0000000000000003.blktrace"
    theirs.mkdir(mode=0o700)
    (theirs / "keep").write_text("x")
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    os.chown(theirs, 65534, 65534)
    lines = restore_leftovers(HostRoot(), tmp_path)
    assert sorted(lines) == sorted(f"{p}: not a blktrace scratch directory of this user; left alone"
                                   for p in (link, open_dir, theirs))
    assert all((d / "keep").exists() for d in (victim, open_dir, theirs))
    with pytest.raises(KvmtuneError, match="cannot create blktrace's scratch directory"):
        bt.BlkTrace(HostRoot(), Runner()).start([DEVICE], link)
    assert (victim / "keep").exists() and sorted(os.listdir(victim)) == ["keep"]


def test_blkparse_records_beyond_a_trace_events_bounds_are_skipped() -> None:
    """A request over 4 GiB or ending past 2^62 (what a workload file may hold) is skipped and counted, as a trace
    event's is, rather than making the capture refuse to write its own file."""
    text = ("D 0.000000001 R 8 4096\nC 0.000000002 R 8 4096\n"
            "D 0.000000003 W 16 8589934592\nC 0.000000004 W 16 8589934592\n"
            f"D 0.000000005 R {(1 << 62) // 512} 4096\n")
    reqs, skipped, _ = bt.parse(text, max_events=10)
    assert [(r.write, r.offset, r.size) for r in reqs] == [(False, 8 * 512, 4096)]
    assert skipped == 3


def test_a_block_device_the_qemu_does_not_hold_is_not_traced(tmp_path: Path, standin: Path) -> None:
    """A QEMU another user runs answers its own QMP: its ``query-block`` may name any block device (the host's own
    disk). Before, root traced whatever block device in /dev it named; now only one the QEMU holds open."""
    other = next((d for d in (f"/dev/loop{i}" for i in range(1, 8)) if os.path.exists(d)), None)
    if other is None:
        pytest.skip("needs a second loop device node")
    qmp = Qmp(TOTALS, file=other)
    cap = Capture(HostRoot(), os.getpid(), tmp_path, seconds=0.01, trace=False, tick=lambda s: None,
                  blktrace=bt.BlkTrace(mounts(tmp_path), Runner()))
    with pytest.raises(KvmtuneError, match="--source blktrace refused") as exc:
        cap._run(qmp, me())
    assert f"its image {other} ({other}) is not open in pid {os.getpid()}" in str(exc.value)
    assert not standin.exists()
    assert "block-latency-histogram-set" not in qmp.sent


def test_blkparse_output_is_read_as_it_comes_not_held_whole(
        tmp_path: Path, standin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A device busy with other processes' I/O (or the guest's own, for up to an hour) prints millions of blkparse
    lines; they were held whole in memory (the output as one string, then split), as root on a hypervisor. Now they
    are parsed as they come and at most ``--max-events`` requests kept: 240,000 lines here peaked at 29 MB of traced
    Python memory when held whole, about 60 KB now."""
    import tracemalloc

    monkeypatch.setenv("KVMTUNE_BLKTRACE_RECORDS", json.dumps(RECORDS))
    monkeypatch.setenv("KVMTUNE_BLKTRACE_REPEAT", "20000")
    trace = bt.BlkTrace(mounts(tmp_path), Runner())
    trace.start([DEVICE], tmp_path / "capture-active-1-0123456789abcdef.blktrace")
    assert trace.halt() == ""
    tracemalloc.start()
    try:
        per_device, notes = trace.read(max_events=100)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    reqs = per_device[DEVICE]
    assert len(reqs) == 100 and len(notes) <= 1  # blkparse's own "Input file … added" line, out of format
    assert all(r.t_done is not None for r in reqs[:90])
    assert peak < 4 << 20, peak
    assert trace.scratch is None
