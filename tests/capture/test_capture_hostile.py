"""Hostile inputs to ``kvmtune capture`` (security review of issue 51): the marker in a shared work directory, a
marker naming a process that is no longer the QEMU it changed, QMP names with terminal escapes, trace lines written
into QEMU's stderr by someone else, and workload files from another host."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvmtune.capture import session
from kvmtune.capture.session import Capture, blockstats, identity, restore_leftovers
from kvmtune.errors import KvmtuneError
from kvmtune.host.root import HostRoot

QDEV = "/machine/peripheral/d0/virtio-backend"
PID = 4242


def sub(t: float, req: int, write: bool, sector: int, n: int) -> bytes:
    kind = "write" if write else "read"
    return (f"{PID}@{int(t)}.{round((t % 1) * 1e6):06d}:virtio_blk_handle_{kind} vdev 0xaa req 0x{req:x} "
            f"sector {sector} nsectors {n}").encode()


def done(t: float, req: int) -> bytes:
    return f"{PID}@{int(t)}.{round((t % 1) * 1e6):06d}:virtio_blk_rw_complete vdev 0xaa req 0x{req:x} ret 0".encode()


class FakeQmp:
    """A guest's QMP that answers blockstats for one disk and records what it is sent."""

    def __init__(self, qdev: str = QDEV) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.qdev = qdev

    def execute(self, cmd: str, **args: Any) -> Any:
        self.sent.append((cmd, args))
        if cmd == "query-blockstats":
            return [{"device": "", "qdev": self.qdev, "stats": {"rd_operations": 1, "wr_operations": 1}}]
        return {}

    def close(self) -> None:
        pass


def capture(tmp_path: Path) -> Capture:
    return Capture(HostRoot(), os.getpid(), tmp_path, seconds=0.01, trace=False, tick=lambda s: None)


def me() -> dict[str, Any]:
    ident = identity(HostRoot(), os.getpid())
    assert ident is not None
    return ident


# --- the marker ----------------------------------------------------------------------------------------------


def test_a_symlink_planted_at_the_old_predictable_marker_name_is_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / f"capture-active-{os.getpid()}.json").symlink_to(victim)
    capture(tmp_path)._run(FakeQmp(), me())
    assert victim.read_text() == "precious\n"


def test_a_symlink_at_the_markers_own_name_refuses_the_capture_before_it_changes_anything(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session.secrets, "token_hex", lambda n: "0123456789abcdef")
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / f"capture-active-{os.getpid()}-0123456789abcdef.json").symlink_to(victim)
    qmp = FakeQmp()
    with pytest.raises(KvmtuneError, match="cannot create the capture marker"):
        capture(tmp_path)._run(qmp, me())
    assert victim.read_text() == "precious\n"
    assert not [c for c, _ in qmp.sent if c != "query-blockstats"]  # no histogram set, no event enabled


def test_the_marker_is_private_and_names_the_qemu_by_start_time_boot_and_owner(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def look(*a: Any, **k: Any) -> None:
        (marker,) = tmp_path.glob("capture-active-*.json")
        seen["mode"] = stat.S_IMODE(marker.stat().st_mode)
        seen["doc"] = json.loads(marker.read_text())

    cap = Capture(HostRoot(), os.getpid(), tmp_path, seconds=0.01, trace=False, tick=look)
    cap._run(FakeQmp(), me())
    assert seen["mode"] == 0o600
    assert {k: seen["doc"][k] for k in ("pid", "starttime", "uid", "boot_id")} == me()
    assert not list(tmp_path.glob("capture-active-*.json"))


def _marker(tmp_path: Path, **over: Any) -> Path:
    path = tmp_path / "capture-active-5.json"
    path.write_text(json.dumps({**me(), "events": ["virtio_blk_rw_complete"], "histograms": [QDEV], **over}))
    return path


@pytest.mark.parametrize("over", [{"uid": os.geteuid() + 1}, {"boot_id": "00000000-0000-0000-0000-000000000000"},
                                  {"starttime": 1}])
def test_a_marker_whose_pid_is_now_another_process_sends_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, over: dict[str, Any]) -> None:
    """Same pid, but another owner, another boot (start times repeat across reboots) or another start time: not
    the QEMU the capture changed, so no QMP is even looked for."""
    reached: list[int] = []
    monkeypatch.setattr(session, "reach", lambda host, pid, lv: reached.append(pid))
    _marker(tmp_path, **over)
    (line,) = restore_leftovers(HostRoot(), tmp_path)
    assert "has ended, nothing to restore" in line and reached == []


def test_a_marker_without_the_owner_and_boot_is_not_obeyed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session, "reach", lambda host, pid, lv: pytest.fail("reached"))
    path = _marker(tmp_path)
    doc = json.loads(path.read_text())
    del doc["uid"], doc["boot_id"]
    path.write_text(json.dumps(doc))
    (line,) = restore_leftovers(HostRoot(), tmp_path)
    assert "unreadable capture marker; removed" in line


def test_a_group_writable_marker_or_a_fifo_is_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session, "reach", lambda host, pid, lv: pytest.fail("reached"))
    path = _marker(tmp_path)
    path.chmod(0o666)
    os.mkfifo(tmp_path / "capture-active-6.json")  # opened without blocking, then refused
    lines = restore_leftovers(HostRoot(), tmp_path)
    assert len(lines) == 2 and all("not a capture marker of this user; left alone" in x for x in lines)
    assert path.exists()


def test_a_restored_line_never_carries_a_terminal_escape_and_only_plain_qdevs_are_sent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    qmp = FakeQmp()
    monkeypatch.setattr(session, "reach", lambda host, pid, lv: (qmp, lambda: None, None, ""))
    _marker(tmp_path, histograms=[QDEV, "x\x1b]0;pwned\x07", "a b", "../../etc"])
    (line,) = restore_leftovers(HostRoot(), tmp_path)
    assert [a.get("id") for c, a in qmp.sent if c == "block-latency-histogram-set"] == [QDEV, "../../etc"]
    assert "\x1b" not in line and "\x07" not in line

    def broken(host: HostRoot, pid: int, lv: Any) -> Any:
        raise KvmtuneError("libvirt says \x1b[2J\u2028fake line")
    monkeypatch.setattr(session, "reach", broken)
    _marker(tmp_path)
    (line,) = restore_leftovers(HostRoot(), tmp_path)
    assert "marker kept" in line and "\x1b" not in line and "\u2028" not in line


def test_a_qdev_out_of_pattern_in_a_qmp_reply_is_not_kept() -> None:
    class Named(FakeQmp):
        def execute(self, cmd: str, **args: Any) -> Any:
            return [{"device": "drive0", "qdev": "/machine/peripheral/x\x1b]0;t\x07", "stats": {}}]
    assert [v["qdev"] for v in blockstats(Named()).values()] == [None]  # named by its drive, its qdev not kept
    assert blockstats(FakeQmp("/machine/peripheral/x\x1b]0;t\x07")) == {}  # named by nothing else: left out
    assert [v["qdev"] for v in blockstats(FakeQmp("/machine/peripheral-anon/device[0]/virtio-backend")).values()] \
        == ["/machine/peripheral-anon/device[0]/virtio-backend"]


# --- trace lines someone else wrote into QEMU's stderr --------------------------------------------------------


def test_trace_lines_out_of_range_or_out_of_time_are_skipped_and_the_file_stays_readable() -> None:
    from kvmtune.capture.trace import TraceReader
    from kvmtune.capture.workload import SCHEMA, StatsDelta, check_workload, from_trace

    r = TraceReader(PID, window=(1000.0, 1100.0))
    for line in (
        sub(1000.1, 1, False, 0, 8), done(1000.2, 1),  # a real pair
        sub(1000.3, 2, True, 99999999999999999999, 8), done(1000.4, 2),  # offset past 2**62
        sub(1000.3, 3, True, 0, 9999999999), done(1000.4, 3),  # one request of 5 TB
        sub(1000.5, 4, False, 8, 8), done(1000.45, 4),  # completed before it was submitted
        sub(999999999999.0, 5, False, 16, 8), done(999999999999.5, 5),  # far in the future
        sub(1000.6, 6, False, 8, 8), done(5.0, 6),  # its completion long before the capture
    ):
        r.line(line)
    assert [(q.offset, q.size) for q in r.requests] == [(0, 4096)]
    assert r.skipped == 6  # each out-of-range submission, the early completion, the two far times, the early one
    doc = {"schema": SCHEMA, "guest": "g", "captured_at": "now",
           "disks": [from_trace("vda", r.requests, StatsDelta(1.0, rd_ops=1))]}
    check_workload(json.loads(json.dumps(doc)))  # what kvmtune writes, --show reads back


def test_scsi_lengths_and_blocks_out_of_range_are_skipped() -> None:
    from kvmtune.capture.trace import TraceReader

    def line(t: float, rest: str) -> bytes:
        return f"7@{int(t)}.{round((t % 1) * 1e6):06d}:{rest}".encode()

    r = TraceReader(7, scsi_blocks={(0, 0): 4096})
    for raw in (
        line(1.0, "scsi_req_parsed target 0 lun 0 tag 1 command 40 dir 2 length 9999999999"),
        line(1.0, "scsi_req_parsed_lba target 0 lun 0 tag 1 command 40 lba 0"),
        line(1.1, "scsi_req_dequeue target 0 lun 0 tag 1"),
        line(1.0, "scsi_req_parsed target 0 lun 0 tag 2 command 40 dir 2 length 4096"),
        line(1.0, "scsi_req_parsed_lba target 0 lun 0 tag 2 command 40 lba 99999999999999999999"),
        line(1.1, "scsi_req_dequeue target 0 lun 0 tag 2"),
        line(2.0, "scsi_req_parsed target 0 lun 0 tag 3 command 40 dir 2 length 4096"),
        line(2.0, "scsi_req_parsed_lba target 0 lun 0 tag 3 command 40 lba 2"),
        line(2.1, "scsi_req_dequeue target 0 lun 0 tag 3"),
    ):
        r.line(raw)
    assert [(q.offset, q.size) for q in r.requests] == [(8192, 4096)] and r.skipped == 2


def _stderr_of(tmp_path: Path, stderr: Any) -> tuple[Any, str]:
    proc = subprocess.Popen(["sleep", "30"], stderr=stderr)
    try:
        return Capture(HostRoot(), proc.pid, tmp_path, seconds=1, trace=True)._stderr()
    finally:
        proc.kill()
        proc.wait()


def test_a_stderr_file_others_may_write_is_not_read_for_events(tmp_path: Path) -> None:
    log = tmp_path / "qemu.log"
    log.touch()
    log.chmod(0o666)  # e.g. a QEMU started with 2>/tmp/qemu.log by a careless umask: anyone can append lines
    with open(log, "ab") as err:
        fh, why = _stderr_of(tmp_path, err)
    assert fh is None and "writable by group or others (mode 0666)" in why and "could have been written by anyone" in why


def test_a_stderr_that_is_a_device_is_refused_without_being_opened(tmp_path: Path) -> None:
    with open("/dev/null", "wb") as err:
        fh, why = _stderr_of(tmp_path, err)
    assert fh is None and "not a regular file" in why and "/dev/null" in why


# --- a workload file from another host (--show) ------------------------------------------------------------------


def _doc() -> dict[str, Any]:
    from kvmtune.capture.trace import Request
    from kvmtune.capture.workload import SCHEMA, StatsDelta, from_trace

    reqs = [Request(i * 0.01, i * 0.01 + 0.001, 1, False, i * 4096, 4096) for i in range(10)]
    return {"schema": SCHEMA, "guest": "g", "captured_at": "now",
            "disks": [from_trace("vda", reqs, StatsDelta(1.0, rd_ops=10))]}


@pytest.mark.parametrize(("raw_from", "raw_to"), [
    ('"seconds": 1.0', '"seconds": 1' + "0" * 400),  # an int no float holds: math.isfinite overflowed
    ('"iops": 100.0', '"iops": -1' + "0" * 400),  # 10 requests 10 ms apart
    ('"guest": "g"', '"guest": "\\ud800"'),  # a lone surrogate: printing it raised UnicodeEncodeError
    ('"target": "vda"', '"target": "vd\\udfffa"'),
    ('"4096": 10', '"4096": 1' + "0" * 30),  # a bucket count past any capture
])
def test_show_refuses_numbers_and_strings_that_used_to_crash_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], raw_from: str, raw_to: str) -> None:
    from kvmtune.cli import main

    text = json.dumps(_doc())
    assert raw_from in text
    f = tmp_path / "w.json"
    f.write_text(text.replace(raw_from, raw_to))
    assert main(["capture", "--show", str(f)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(f) in err and "Traceback" not in err


def test_show_escapes_every_other_line_break_and_bidi_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kvmtune.cli import main

    doc = _doc()
    doc["guest"] = "a\r\u0085b\u2028c\u2029d\u202ee\x1b[2J\x9b31m"
    f = tmp_path / "w.json"
    f.write_text(json.dumps(doc))
    assert main(["capture", "--show", str(f)]) == 0
    out = capsys.readouterr().out
    assert not any(c in out for c in "\r\u0085\u2028\u2029\u202e\x1b\x9b")
    assert out.startswith("workload of a\\x0d\\x85b\\u2028c\\u2029d\\u202ee\\x1b[2J\\x9b31m, captured now")


def test_show_as_json_gives_only_what_was_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--format json`` is "the checked file": keys the schema does not have were passed on as they came (text no
    check looked at; a nesting deep enough that the indenting printer recursed past Python's limit, where the
    parser had not). Now only the checked fields are printed, and the same document goes to a replay."""
    from kvmtune.cli import main

    doc = _doc()
    doc["note"] = "</script><script>alert(1)</script>\u202e"
    doc["disks"][0]["extra"] = {"x": 1}
    doc["disks"][0]["ops"]["smuggled"] = "\x1b[2J"
    text = json.dumps(doc)
    deep = "[" * 400 + "]" * 400  # the parser takes it; the indenting printer's recursion did not
    f = tmp_path / "w.json"
    f.write_text(text[:-1] + f', "nested": {deep}}}')
    assert main(["capture", "--show", str(f), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"schema", "guest", "captured_at", "disks"}
    assert "extra" not in out["disks"][0] and set(out["disks"][0]["ops"]) == {"read", "write", "flush", "discard"}
    want = _doc()
    assert out == want


@pytest.mark.parametrize(("key", "value", "problem"), [
    ("latency_us", {"p50": -1, "p99": 5}, "disks[0].latency_us.p50: -1 is not a number in [0, 1e+12]"),
    ("latency_us", {"p50": 1, "p99": "\x1b[2J"}, "disks[0].latency_us.p99: '\\x1b[2J' is not a number"),
    ("latency_us", [1, 2], "disks[0].latency_us: not an object"),
    ("offset_base", "/etc/passwd", "disks[0].offset_base: '/etc/passwd' is not a number"),
    ("offset_base", 1e300, "disks[0].offset_base: 1e+300 is not a number"),
])
def test_show_checks_the_latency_and_offset_base_a_capture_writes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, value: object, problem: str) -> None:
    """Two fields every capture writes were passed on unchecked (``--format json``)."""
    from kvmtune.cli import main

    doc = _doc()
    doc["disks"][0][key] = value
    f = tmp_path / "w.json"
    f.write_text(json.dumps(doc))
    assert main(["capture", "--show", str(f), "--format", "json"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(f) in err and problem in err, err
    assert "\x1b" not in err


def test_a_2_gib_workload_file_or_iolog_is_refused_by_its_size_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Refused before a byte is read (sparse: no disk used), and the line says what the file was taken for (it read
    "larger than 4 MiBworkload file")."""
    from kvmtune.cli import main
    from kvmtune.errors import InputError
    from kvmtune.lab.storage.replay import read_iolog

    big = tmp_path / "w.json"
    with open(big, "wb") as fh:
        fh.truncate(2 << 30)
    assert main(["capture", "--show", str(big), "--format", "json"]) == 2
    err = capsys.readouterr().err
    assert err == f"kvmtune: {big}: larger than 4 MiB (a workload file), refused\n"
    with pytest.raises(InputError, match=r"larger than 256 MiB \(an iolog\), refused"):
        read_iolog(big)


# --- the output file ------------------------------------------------------------------------------------------


def test_the_output_replaces_a_symlink_without_following_it_and_drops_a_stale_iolog(tmp_path: Path) -> None:
    from kvmtune.cli.capture import write_files

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out = tmp_path / "w.json"
    out.symlink_to(victim)
    Path(f"{out}.iolog").symlink_to(victim)
    write_files(out, _doc(), "fio version 3 iolog\n")
    assert victim.read_text() == "precious\n"
    assert not out.is_symlink() and json.loads(out.read_text())["guest"] == "g"
    assert Path(f"{out}.iolog").read_text() == "fio version 3 iolog\n"
    write_files(out, _doc(), "")  # a statistics capture: the earlier iolog is not this file's
    assert not Path(f"{out}.iolog").exists() and victim.read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim", "w.json"]


def test_a_part_file_planted_beside_the_output_stops_the_write_and_nothing_is_half_written(tmp_path: Path) -> None:
    from kvmtune.cli.capture import write_files

    out = tmp_path / "w.json"
    out.write_text("old\n")
    Path(f"{out}.iolog").write_text("old log\n")
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / f".w.json.iolog.part{os.getpid()}").symlink_to(victim)
    with pytest.raises(FileExistsError):
        write_files(out, _doc(), "fio version 3 iolog\n")
    assert victim.read_text() == "precious\n"
    assert out.read_text() == "old\n" and Path(f"{out}.iolog").read_text() == "old log\n"  # the pair unchanged


def test_the_marker_of_a_capture_that_still_runs_is_not_undone_under_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``doctor`` (or a second capture) while a capture runs: its events stay on and its marker stays."""
    monkeypatch.setattr(session, "reach", lambda host, pid, lv: pytest.fail("reached"))
    path = _marker(tmp_path, capture={"pid": os.getpid(), "starttime": me()["starttime"]})
    (line,) = restore_leftovers(HostRoot(), tmp_path)
    assert f"by kvmtune pid {os.getpid()} still runs; left alone" in line and path.exists()


def test_the_marker_of_a_killed_capture_is_undone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    qmp = FakeQmp()
    monkeypatch.setattr(session, "reach", lambda host, pid, lv: (qmp, lambda: None, None, ""))
    path = _marker(tmp_path, capture={"pid": proc.pid, "starttime": 1})
    (line,) = restore_leftovers(HostRoot(), tmp_path)
    assert "trace event virtio_blk_rw_complete off" in line and not path.exists()


def test_a_capture_writes_its_own_identity_into_its_marker(tmp_path: Path) -> None:
    seen: list[Any] = []

    def look(*a: Any) -> None:
        (marker,) = tmp_path.glob("capture-active-*.json")
        seen.append(json.loads(marker.read_text())["capture"])
        seen.append(restore_leftovers(HostRoot(), tmp_path))  # a doctor run meanwhile

    Capture(HostRoot(), os.getpid(), tmp_path, seconds=0.01, trace=False, tick=look)._run(FakeQmp(), me())
    assert seen[0] == {"pid": os.getpid(), "starttime": me()["starttime"]}
    assert "still runs; left alone" in seen[1][0]


@pytest.mark.parametrize("name", ["vd\ud800a", "x" * 101, "a b", "vda\x1b[2J", "vda\u2028"])
def test_a_disk_name_out_of_pattern_in_a_qmp_reply_is_left_out(name: str) -> None:
    class Qmp(FakeQmp):
        def execute(self, cmd: str, **args: Any) -> Any:
            return [{"device": name, "qdev": None, "stats": {}}, {"device": "drive0", "qdev": None, "stats": {}}]
    assert list(blockstats(Qmp())) == ["drive0"]


def test_a_guest_name_the_file_could_not_hold_is_refused_before_writing(tmp_path: Path) -> None:
    from kvmtune.capture.session import CaptureResult
    from kvmtune.capture.workload import StatsDelta
    from kvmtune.cli.capture import workload

    r = CaptureResult(1.0, {"vda": StatsDelta(1.0, rd_ops=5)}, {"vda": []}, None)
    with pytest.raises(KvmtuneError, match="would not read back"):
        workload("q" * 300, r, None, False)  # a QEMU -name of 300 characters: --show refuses over 200
    doc, _ = workload("q", r, None, False)
    assert doc["guest"] == "q"


def test_a_uuid_that_names_another_domain_than_the_marker_or_target_says_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The pid file and the log are found by the name, QMP by the UUID: both must be the same domain's."""
    pytest.importorskip("libvirt", reason="libvirt's Python binding (Debian's is built for its 3.11 only)")
    from kvmtune.capture import libvirt as lvmod

    closed: list[bool] = []

    class Dom:
        def name(self) -> str:
            return "other"

        def isActive(self) -> bool:
            return True

        def XMLDesc(self, flags: int) -> str:
            return "<domain><devices/></domain>"

    class Conn:
        def lookupByUUIDString(self, uuid: str) -> Dom:
            return Dom()

        def close(self) -> None:
            closed.append(True)

    monkeypatch.setattr(lvmod, "open_connection", lambda uri, read_only: Conn())
    g = lvmod.LibvirtGuest("qemu:///system", "12345678-1234-1234-1234-123456789abc", "web01")
    with pytest.raises(KvmtuneError, match="names domain 'other', not this one"):
        g.open()
    assert closed == [True]


def test_a_libvirt_log_others_may_write_is_not_followed(tmp_path: Path) -> None:
    from kvmtune.capture.libvirt import LogFollower
    from kvmtune.host.root import HostReadError

    log = tmp_path / "g.log"
    log.write_bytes(b"")
    log.chmod(0o622)
    with pytest.raises(HostReadError, match="others may write lines into it"):
        LogFollower(HostRoot(), str(log))


def test_a_qemu_that_ends_while_its_qmp_is_found_gets_nothing_sent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc = subprocess.Popen(["sleep", "30"])
    qmp = FakeQmp()

    def reach(host: HostRoot, pid: int, lv: Any) -> Any:
        proc.kill()  # the pid is another process's (or none) by the time the socket answers
        proc.wait()
        return qmp, lambda: None, None, ""
    monkeypatch.setattr(session, "reach", reach)
    try:
        with pytest.raises(KvmtuneError, match="ended while its QMP was being found"):
            Capture(HostRoot(), proc.pid, tmp_path, seconds=0.01, trace=False, tick=lambda s: None).run()
    finally:
        proc.kill()
        proc.wait()
    assert qmp.sent == [] and list(tmp_path.iterdir()) == []


def test_made_up_requests_whose_counts_match_a_disk_but_not_its_bytes_are_not_put_on_it() -> None:
    """Someone who writes lines into QEMU's stderr can copy a quiet disk's counts from its blockstats, but the
    sizes they make up must carry that disk's bytes too."""
    from kvmtune.capture.session import attribute
    from kvmtune.capture.trace import Request
    from kvmtune.capture.workload import StatsDelta

    fake = [Request(i * 0.01, i * 0.01 + 0.001, 0xBAD, i % 2 == 0, i * 1 << 30, 1 << 20) for i in range(100)]
    real = StatsDelta(1.0, rd_ops=50, wr_ops=50, rd_bytes=50 * 4096, wr_bytes=50 * 4096)
    got, why = attribute(fake, {"vdb": real})
    assert got is None and "carry 104857600 bytes, disk vdb's blockstats 409600" in why
    honest = [Request(q.t_submit, q.t_done, q.vdev, q.write, q.offset, 4096) for q in fake]
    got, why = attribute(honest, {"vdb": real})
    assert got == {"vdb": honest} and why == ""


@pytest.mark.parametrize("raw", [b"[" * 60000, b"\xff\xfe", b"[]", b"null", b"DUP"])
def test_a_malformed_marker_is_one_line_and_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raw: bytes) -> None:
    monkeypatch.setattr(session, "reach", lambda host, pid, lv: pytest.fail("reached"))
    if raw == b"DUP":  # a whole good marker, then its pid again (a reader keeping the last would obey it)
        raw = json.dumps({**me(), "events": [], "histograms": []}).encode()[:-1] + b', "pid": 1}'
    path = tmp_path / "capture-active-8.json"
    path.write_bytes(raw)
    (line,) = restore_leftovers(HostRoot(), tmp_path)
    assert "unreadable capture marker; removed" in line and not path.exists()


# --- an early end -------------------------------------------------------------------------------------------


def test_ctrl_c_in_the_wait_reads_blockstats_once_more_at_once_and_ends(tmp_path: Path) -> None:
    """SIGTERM (raised as KeyboardInterrupt) up to a second after a read: the events switched off right after would
    hold a second of requests the last read never counted; one more read at once keeps the two together."""
    ticks: list[float] = []

    def tick(s: float) -> None:  # the wait comes in steps of POLL_S (the trace stream read after each)
        ticks.append(s)
        if sum(ticks) > 1.05:  # in the second second's wait
            raise KeyboardInterrupt

    qmp = FakeQmp()
    cap = Capture(HostRoot(), os.getpid(), tmp_path, seconds=60, trace=False, tick=tick)
    cap._run(qmp, me())
    reads = [n for n, (c, _) in enumerate(qmp.sent) if c == "query-blockstats"]
    assert sum(ticks) < 1.2  # ended by the interrupt, not by the 60 s
    # the first read (before the histograms), the loop's first, one after each tick: the interrupted one included
    assert len(reads) == 4, qmp.sent
    assert not list(tmp_path.glob("capture-active-*.json"))
