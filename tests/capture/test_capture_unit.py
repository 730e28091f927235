"""kvmtune capture without a guest: trace lines as hostile input, attribution, the workload file and --show."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from kvmtune.capture.session import attribute, restore_leftovers
from kvmtune.capture.trace import MAX_LINE, Request, TraceReader
from kvmtune.capture.workload import SCHEMA, StatsDelta, from_stats, from_trace, iolog, load_workload, render
from kvmtune.cli import main
from kvmtune.errors import InputError
from kvmtune.host.root import HostRoot

PID = 4242


def sub(t: float, req: int, write: bool, sector: int, n: int, pid: int = PID, vdev: int = 0xAA) -> bytes:
    kind = "write" if write else "read"
    return (f"{pid}@{int(t)}.{round((t % 1) * 1e6):06d}:virtio_blk_handle_{kind} vdev 0x{vdev:x} req 0x{req:x} "
            f"sector {sector} nsectors {n}").encode()


def done(t: float, req: int, pid: int = PID, vdev: int = 0xAA, ret: int = 0) -> bytes:
    return f"{pid}@{int(t)}.{round((t % 1) * 1e6):06d}:virtio_blk_rw_complete vdev 0x{vdev:x} req 0x{req:x} ret {ret}".encode()


def test_submissions_pair_with_completions_by_request_and_a_cut_line_waits_for_its_rest() -> None:
    r = TraceReader(PID)
    data = b"\n".join([sub(100.0, 1, False, 8, 32), sub(100.001, 2, True, 64, 32), done(100.002, 2), done(100.004, 1)])
    r.feed(data[:50])
    r.feed(data[50:] + b"\n")
    assert [(q.write, q.offset, q.size) for q in r.requests] == [(True, 64 * 512, 16384), (False, 4096, 16384)]
    assert r.requests[1].t_done == pytest.approx(100.004) and r.skipped == 0


@pytest.mark.parametrize("line", [
    sub(1, 1, False, 0, 8) + b" data 0xdeadbeef",                       # trailing text
    sub(1, 1, False, 0, 8).replace(b" req ", b"  req "),                # other spacing
    sub(1, 1, False, 0, 8).replace(b"sector 0", b"sector -1"),
    sub(1, 1, False, 0, 8).replace(b"sector 0", b"sector 0\xe2\x80\xa8"),  # U+2028 inside
    sub(1, 1, False, 0, 8).replace(b"sector 0", b"sector 0\r"),
    sub(1, 1, False, 0, 8).replace(b"nsectors 8", b"nsectors 99999999999"),
    b"4242@1.000000:virtio_blk_handle_read vdev 0xAA req 0x1 sector 0 nsectors 8",  # upper-case pointer
    sub(1, 1, False, 0, 8) + b"x" * MAX_LINE,                          # oversize
])
def test_a_line_that_does_not_match_whole_is_skipped_and_counted(line: bytes) -> None:
    r = TraceReader(PID)
    r.feed(line + b"\n" + done(2, 1) + b"\n")
    assert r.requests == [] and r.skipped >= 1


def test_events_of_another_pid_or_without_timestamps_are_counted_not_used() -> None:
    r = TraceReader(PID)
    untimed = sub(1, 1, False, 0, 8).split(b":", 1)[1]
    r.feed(b"\n".join([sub(1, 1, False, 0, 8, pid=7), done(2, 1, pid=7), untimed, b"qemu: some warning"]) + b"\n")
    assert r.requests == [] and r.foreign == 2 and r.untimed == 1


def test_max_events_bounds_the_requests_kept() -> None:
    r = TraceReader(PID, max_events=3)
    r.feed(b"\n".join(x for i in range(10) for x in (sub(1 + i, i + 1, False, i * 8, 8), done(1.5 + i, i + 1))) + b"\n")
    assert len(r.requests) == 3 and r.full and r.dropped == 7


def reqs(n: int, vdev: int, write_every: int = 3) -> list[Request]:
    return [Request(i * 0.01, i * 0.01 + 0.04, vdev, i % write_every == 0, (i * 7919 % 1000) * 16384, 16384)
            for i in range(n)]


def test_requests_go_to_the_disk_whose_blockstats_agree_else_per_request_mode_is_refused() -> None:
    a, b = reqs(300, 0xA), reqs(90, 0xB)
    kib16 = 16384
    stats = {"d0": StatsDelta(3, rd_ops=200, wr_ops=100, rd_bytes=200 * kib16, wr_bytes=100 * kib16),
             "d1": StatsDelta(3, rd_ops=60, wr_ops=30, rd_bytes=60 * kib16, wr_bytes=30 * kib16)}
    got, why = attribute(a + b, stats)
    assert got is not None and got["d0"] == a and got["d1"] == b and why == ""
    same = {"d0": StatsDelta(3, rd_ops=200, wr_ops=100), "d1": StatsDelta(3, rd_ops=200, wr_ops=100)}
    got, why = attribute(a, same)
    assert got is None and "do not match one disk" in why


def test_a_trace_summary_measures_mix_size_order_and_depth() -> None:
    r = reqs(300, 0xA)
    d = from_trace("d0", r, StatsDelta(3.0, rd_ops=200, wr_ops=100, flush_ops=10))
    assert d["read_fraction"] == pytest.approx(2 / 3, abs=0.01)
    assert d["size_bytes"]["p50"] == 16384 and d["size_bytes"]["histogram"] == {"16384": 300}
    assert d["sequential_fraction"] < 0.2
    assert d["queue_depth"]["mean"] == pytest.approx(4, abs=0.2)  # 40 ms each, one every 10 ms
    assert d["flush_per_write"] == pytest.approx(0.1) and d["ops"]["flush"] == 10
    assert d["iops"] == pytest.approx(100, rel=0.001)  # one every 10 ms
    # the events outlast the blockstats interval (switched on before its first read, off after its last): the rate is
    # the requests' own, not their count over the shorter interval (which would say 120)
    assert from_trace("d0", r, StatsDelta(2.5, rd_ops=200, wr_ops=100))["iops"] == pytest.approx(100, rel=0.001)
    seq = [Request(i * 0.01, i * 0.01 + 0.005, 1, True, i * 1048576, 1048576) for i in range(50)]
    assert from_trace("d0", seq, StatsDelta(0.5, wr_ops=50))["sequential_fraction"] == pytest.approx(49 / 50)


def test_blockstats_give_the_mean_size_and_littles_law_depth_and_say_what_they_cannot_know() -> None:
    total = StatsDelta(10, rd_ops=700, wr_ops=300, rd_bytes=700 * 16384, wr_bytes=300 * 16384,
                       rd_ns=int(30e9), wr_ns=int(10e9))
    d = from_stats("d0", total, [StatsDelta(1, rd_ns=int(4e9))] * 10)
    assert d["read_fraction"] == 0.7 and d["size_bytes"]["mean"] == 16384 and d["queue_depth"]["mean"] == 4.0
    assert d["size_bytes"]["p50"] is None and d["sequential_fraction"] is None


def test_the_iolog_is_fio_version_3_and_anonymize_starts_offsets_at_zero() -> None:
    r = [Request(5.0, 5.1, 1, False, 1 << 30, 4096), Request(5.002, 5.1, 1, True, (1 << 30) + 8192, 4096)]
    text = iolog("vda", r, anonymize=True)
    assert text.splitlines() == ["fio version 3 iolog", "0 disk0 add", "0 disk0 open", "0 disk0 read 0 4096",
                                 "2000 disk0 write 8192 4096", "2000 disk0 close"]  # µs


def good_doc() -> dict[str, Any]:
    d = from_trace("d0", reqs(30, 1), StatsDelta(1.0, rd_ops=20, wr_ops=10))
    return {"schema": SCHEMA, "guest": "g1", "captured_at": "2026-12-02T00:00:00Z", "disks": [d]}


def test_show_prints_a_good_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "w.json"
    f.write_text(json.dumps(good_doc()))
    assert main(["capture", "--show", str(f)]) == 0
    out = capsys.readouterr().out
    assert "disk d0: 1 s from trace" in out and "read fraction 0.6667" in out


@pytest.mark.parametrize("mutate", [
    lambda d: d.update(schema="kvmtune-workload/2"),
    lambda d: d.update(guest="g\x1b]0;pwned\x07" * 40),
    lambda d: d.update(disks=[]),
    lambda d: d.update(disks=[d["disks"][0]] * 65),
    lambda d: d["disks"][0].update(read_fraction=1.5),
    lambda d: d["disks"][0].update(source="/etc/passwd"),
    lambda d: d["disks"][0]["ops"].update(read=True),
    lambda d: d["disks"][0]["ops"].update(read=-1),
    lambda d: d["disks"][0]["size_bytes"].update(histogram={"4k": 1}),
    lambda d: d["disks"][0].pop("queue_depth"),
    lambda d: d["disks"][0].update(iops="many"),
])
def test_show_refuses_a_bad_file_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], mutate: Any) -> None:
    doc = good_doc()
    mutate(doc)
    f = tmp_path / "w.json"
    f.write_text(json.dumps(doc))
    assert main(["capture", "--show", str(f)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(f) in err and "\x1b" not in err


@pytest.mark.parametrize("raw", [
    b'{"schema": "kvmtune-workload/1", "schema": "x"}',   # duplicate key
    b'{"schema": NaN}',
    b"[" * 100000,
    b"\xff\xfe{}",
    b"{}" + b" " * (5 * 1024 * 1024),
])
def test_show_refuses_malformed_json_with_one_line(tmp_path: Path, raw: bytes) -> None:
    f = tmp_path / "w.json"
    f.write_bytes(raw)
    with pytest.raises(InputError) as exc:
        load_workload(str(f))
    assert str(f) in str(exc.value) and "\n" not in str(exc.value)


def test_show_refuses_a_fifo_and_a_hostile_target_prints_escaped(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(InputError):
        load_workload(str(fifo))
    doc = good_doc()
    doc["disks"][0]["target"] = "vda\u2028\x1b[31mred"
    f = tmp_path / "w.json"
    f.write_text(json.dumps(doc))
    text = render(load_workload(str(f)))
    assert "\x1b" not in text and "\u2028" not in text


def test_a_foreign_or_broken_marker_is_not_obeyed(tmp_path: Path) -> None:
    (tmp_path / "capture-active-1.json").write_text("{not json")
    (tmp_path / "capture-active-2.json").write_text(json.dumps({"pid": 999999999, "starttime": 1, "boot_id": "", "uid": 0,
                                                                "events": [], "histograms": []}))
    (tmp_path / "capture-active-3.json").symlink_to("/etc/passwd")
    lines = restore_leftovers(HostRoot(), tmp_path)
    assert any("unreadable capture marker" in x for x in lines)
    assert any("has ended, nothing to restore" in x for x in lines)
    assert any("not a capture marker of this user" in x for x in lines)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["capture-active-3.json"]


def test_capture_help_says_how_it_differs_from_capture_host(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["capture", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "capture-host" in out and "fixture tree" in out


def test_a_stderr_that_is_not_a_regular_file_is_refused_with_the_reason(tmp_path: Path) -> None:
    import subprocess

    from kvmtune.capture.session import Capture

    proc = subprocess.Popen(["sleep", "30"], stderr=subprocess.PIPE)
    try:
        fh, why = Capture(HostRoot(), proc.pid, tmp_path, seconds=1, trace=True)._stderr()
        assert fh is None and "not a regular file" in why and "pipe:" in why
    finally:
        proc.kill()
        proc.wait()


def test_a_stderr_file_is_read_from_its_end(tmp_path: Path) -> None:
    import subprocess

    from kvmtune.capture.session import Capture

    log = tmp_path / "stderr"
    log.write_bytes(sub(1, 1, False, 0, 8) + b"\n")  # before the capture: not its to read
    with open(log, "ab") as err:
        proc = subprocess.Popen(["sleep", "30"], stderr=err)
    try:
        fh, why = Capture(HostRoot(), proc.pid, tmp_path, seconds=1, trace=True)._stderr()
        assert fh is not None and why == ""
        with open(log, "ab") as w:
            w.write(done(2, 1) + b"\n")
        assert fh.read() == done(2, 1) + b"\n"
        fh.close()
    finally:
        proc.kill()
        proc.wait()


def test_show_as_html_draws_each_disk_and_as_json_gives_the_checked_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "w.json"
    doc = good_doc()
    doc["guest"] = "web<01>"
    f.write_text(json.dumps(doc))
    assert main(["capture", "--show", str(f), "--format", "html"]) == 0
    page = capsys.readouterr().out
    assert page.startswith("<!doctype html>") and "Workload of web&lt;01&gt;" in page
    assert "disk d0 (trace, 1.0 s)" in page and page.count("<svg") == 2
    assert main(["capture", "--show", str(f), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(f.read_text())


def test_format_other_than_text_needs_show(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capture", "g1", "-o", "/nonexistent/w.json", "--format", "html"]) == 2
    assert "only with --show FILE" in capsys.readouterr().err


def test_a_second_of_events_past_one_read_is_read_whole_within_that_second(tmp_path: Path) -> None:
    """A fast guest (real KVM: tens of thousands of IOPS) writes more events a second than one 4 MiB read holds.
    Before, the capture read one chunk a second and fell behind: at its end the rest was never read, the requests
    did not match blockstats and per-request mode was refused. Now the stream is read to its end every POLL_S."""
    import io

    from kvmtune.capture.session import POLL_S, READ_CHUNK, Capture

    n = 60_000  # about 9 MB of events: more than two chunks
    lines = b"".join(sub(100.0 + i * 1e-6, i, False, 8 * i, 8) + b"\n" + done(100.0 + i * 1e-6 + 5e-7, i) + b"\n"
                     for i in range(n))
    assert len(lines) > 2 * READ_CHUNK
    stream = io.BytesIO(lines)
    reader = TraceReader(PID)
    steps: list[float] = []
    cap = Capture(HostRoot(), os.getpid(), tmp_path, seconds=1, trace=True, tick=steps.append)
    cap._wait(1.0, stream, reader)
    assert len(reader.requests) == n and reader.skipped == 0
    assert steps == pytest.approx([POLL_S] * round(1 / POLL_S))  # the stream read between steps of the wait
