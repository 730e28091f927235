"""SCSI trace events as hostile input, their pairing by (scsi-id, lun, tag), and the refusal when two SCSI disks share
a (scsi-id, lun); the line formats are QEMU 7.2's (``strings qemu-system-x86_64``: ``scsi_req_parsed target %d lun %d
tag %d command %d dir %d length %d``, ``scsi_req_parsed_lba ... lba %lu``, ``scsi_req_dequeue target %d lun %d tag %d``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvmtune.capture.session import Capture, attribute
from kvmtune.capture.trace import EVENTS, SCSI_EVENTS, TraceReader, device_name, scsi_key
from kvmtune.capture.workload import StatsDelta
from kvmtune.host.root import HostRoot

PID = 4242


def ts(t: float) -> str:
    return f"{PID}@{int(t)}.{round((t % 1) * 1e6):06d}:"


def parsed(t: float, tag: int, cmd: int = 0x28, length: int = 16384, target: int = 0, lun: int = 0) -> bytes:
    direction = 2 if cmd in (0x2A, 0x8A) else 1
    return f"{ts(t)}scsi_req_parsed target {target} lun {lun} tag {tag} command {cmd} dir {direction} length {length}".encode()


def lba(t: float, tag: int, block: int, cmd: int = 0x28, target: int = 0, lun: int = 0) -> bytes:
    return f"{ts(t)}scsi_req_parsed_lba target {target} lun {lun} tag {tag} command {cmd} lba {block}".encode()


def dequeue(t: float, tag: int, target: int = 0, lun: int = 0) -> bytes:
    return f"{ts(t)}scsi_req_dequeue target {target} lun {lun} tag {tag}".encode()


def feed(r: TraceReader, *lines: bytes) -> TraceReader:
    r.feed(b"\n".join(lines) + b"\n")
    return r


def test_a_scsi_read_and_write_pair_by_tag_with_the_disks_block_size() -> None:
    r = feed(TraceReader(PID, scsi_blocks={(0, 1): 4096}),
             parsed(1.0, 7, 0x28, 16384, lun=1), lba(1.0, 7, 10, lun=1),
             parsed(1.001, -5, 0x2A, 4096, lun=1), lba(1.001, -5, 3, 0x2A, lun=1),
             dequeue(1.004, -5, lun=1), dequeue(1.010, 7, lun=1))
    assert [(q.write, q.offset, q.size, q.vdev) for q in r.requests] == [(True, 3 * 4096, 4096, scsi_key(0, 1)),
                                                                         (False, 10 * 4096, 16384, scsi_key(0, 1))]
    assert r.requests[1].t_submit == pytest.approx(1.0) and r.requests[1].t_done == pytest.approx(1.010)
    assert device_name(scsi_key(3, 1)) == "SCSI target 3 lun 1" and r.skipped == 0


def test_scsi_commands_that_are_not_reads_or_writes_and_lone_events_are_not_requests() -> None:
    r = feed(TraceReader(PID),
             parsed(1, 1, 0x35, 0), dequeue(1.1, 1),                   # SYNCHRONIZE CACHE: blockstats count flushes
             parsed(1, 2, 0x12, 36), dequeue(1.1, 2),                  # INQUIRY
             dequeue(1.2, 3),                                          # submitted before the capture
             lba(1, 4, 8), dequeue(1.3, 4),                            # an lba without its parsed line
             parsed(1, 5, 0x28, 4096), dequeue(1.4, 5),                # a read whose lba line never came
             parsed(1, 6, 0x28, 4096, target=1), lba(1, 6, 0, target=1), dequeue(1.5, 6, target=1))  # another target
    assert [(q.vdev, q.offset) for q in r.requests] == [(scsi_key(1, 0), 0)]


@pytest.mark.parametrize("line", [
    parsed(1, 1) + b" extra",
    parsed(1, 1).replace(b" lun ", b"  lun "),
    parsed(1, 1).replace(b"lun 0", b"lun 0\xe2\x80\xa8"),
    parsed(1, 1).replace(b"tag 1", b"tag 0x1"),
    parsed(1, 1).replace(b"length 16384", b"length 99999999999"),
    parsed(1, 1).replace(b"target 0", b"target 99999"),       # beyond a scsi-id: skipped, not keyed
    parsed(1, 1).replace(b"command 40", b"command 4000"),
    parsed(1, 1) + b"\r",
    parsed(1, 1) + b" " * 300,
])
def test_a_scsi_line_that_does_not_match_whole_is_skipped_and_counted(line: bytes) -> None:
    r = feed(TraceReader(PID), line, lba(1, 1, 0), dequeue(2, 1))
    assert r.requests == [] and r.skipped >= 1


def test_scsi_events_of_another_pid_or_without_timestamps_are_counted_not_used() -> None:
    other = [x.replace(f"{PID}@".encode(), b"77@") for x in (parsed(1, 1), lba(1, 1, 0), dequeue(2, 1))]
    r = feed(TraceReader(PID), *other, parsed(1, 2).split(b":", 1)[1])
    assert r.requests == [] and r.foreign == 3 and r.untimed == 1


def test_scsi_requests_go_to_the_disk_whose_blockstats_agree() -> None:
    lines = [x for i in range(30) for x in (parsed(i, i, 0x2A if i % 3 == 0 else 0x28), lba(i, i, i * 32,
                                                                                            0x2A if i % 3 == 0 else 0x28),
                                            dequeue(i + 0.5, i))]
    r = feed(TraceReader(PID), *lines)
    rb, wb = (sum(q.size for q in r.requests if q.write is w) for w in (False, True))
    got, why = attribute(r.requests, {"sda": StatsDelta(30, rd_ops=20, wr_ops=10, rd_bytes=rb, wr_bytes=wb),
                                      "vda": StatsDelta(30)})
    assert why == "" and got is not None and len(got["sda"]) == 30
    got, why = attribute(r.requests, {"sda": StatsDelta(30, rd_ops=200, wr_ops=100), "vda": StatsDelta(30)})
    assert got is None and "SCSI target 0 lun 0's 30 requests do not match" in why


class Qom:
    """query-blockstats' disks as qom-get sees them; trace-event-get-state per family."""

    def __init__(self, devices: dict[str, dict[str, Any]], states: dict[str, str] | None = None) -> None:
        self.devices, self.states = devices, states or {}

    def execute(self, cmd: str, **args: Any) -> Any:
        if cmd == "qom-get":
            return self.devices[args["path"]][args["property"]]
        if cmd == "trace-event-get-state":
            prefix = args["name"].rstrip("*")
            return [{"name": n, "state": s} for n, s in self.states.items() if n.startswith(prefix)]
        raise AssertionError(cmd)

    def close(self) -> None:
        pass


def hd(sid: Any, lun: Any, bs: Any = 512) -> dict[str, Any]:
    return {"type": "scsi-hd", "scsi-id": sid, "lun": lun, "logical_block_size": bs}


def disks(*qdevs: str) -> dict[str, dict[str, Any]]:
    return {q.rsplit("/", 1)[-1]: {"qdev": q} for q in qdevs}


def test_two_scsi_disks_sharing_a_scsi_id_and_lun_refuse_per_request_mode(tmp_path: Path) -> None:
    cap = Capture(HostRoot(), 1, tmp_path, seconds=1, trace=True)
    qom = Qom({"a": hd(0, 0), "b": hd(0, 0), "v": {"type": "virtio-blk-device"}})
    blocks, why = cap._scsi_layout(qom, disks("a", "b", "v"))
    assert blocks == {} and "SCSI disks a and b share scsi-id 0 lun 0" in why and "name no bus" in why
    qom = Qom({"a": hd(0, 0, 4096), "b": hd(1, 0, 3000), "v": {"type": "virtio-blk-device"}})
    assert cap._scsi_layout(qom, disks("a", "b", "v")) == ({(0, 0): 4096, (1, 0): 512}, "")  # 3000: not a block size
    for bad in (hd(True, 0), hd(-1, 0), hd(0, 1 << 20), hd("0", 0)):
        blocks, why = cap._scsi_layout(Qom({"a": bad}), disks("a"))
        assert blocks == {} and "qom-get gave scsi-id" in why


def test_the_scsi_events_are_enabled_beside_virtio_blks_unless_someone_else_holds_one(tmp_path: Path) -> None:
    cap = Capture(HostRoot(), 1, tmp_path, seconds=1, trace=True)
    off = dict.fromkeys(EVENTS + SCSI_EVENTS, "disabled")
    assert cap._events_available(Qom({}, off)) == ([*EVENTS, *SCSI_EVENTS], "")
    assert cap._events_available(Qom({}, dict.fromkeys(EVENTS, "disabled"))) == (list(EVENTS), "")
    held = {**off, "scsi_req_dequeue": "enabled"}
    assert cap._events_available(Qom({}, held)) == ([], "scsi_req_dequeue already enabled by someone else; "
                                                         "not taken over")
    none = dict.fromkeys(EVENTS + SCSI_EVENTS, "unavailable")
    assert cap._events_available(Qom({}, none)) == ([], "its trace events are compiled out (state unavailable)")
