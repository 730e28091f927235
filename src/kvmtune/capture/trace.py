"""QEMU's virtio-blk and SCSI trace events as its ``log`` backend writes them on stderr, read as hostile input.

With ``-msg timestamp=on`` each event is one line, ``PID@SECONDS.MICROS:EVENT ARGS``, e.g.
``18303@1796203488.513378:virtio_blk_handle_read vdev 0x55be… req 0x7f… sector 0 nsectors 8``.

SCSI devices (scsi-hd behind virtio-scsi or another HBA) have no event naming a device pointer: QEMU 7.2's generic
SCSI layer names ``target`` (the scsi-id), ``lun`` and the guest's ``tag``, at submission (``scsi_req_parsed``: the
command, its direction and length in bytes; ``scsi_req_parsed_lba``: its first block) and at completion
(``scsi_req_dequeue``). Their requests are keyed by (target, lun, tag) and grouped per (target, lun)
(:func:`scsi_key`); the bus is named by none of them, which is why the session refuses per-request mode for a guest
whose SCSI disks share a (scsi-id, lun) on two buses. A line longer than
:data:`MAX_LINE`, or one the strict patterns below do not match whole, is skipped and counted, never interpreted;
only numbers are kept (offsets, sizes, times, the device and request pointers as integers), never data.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

# QEMU 7.2's names (qemu-system-x86_64 -trace help): submissions keyed by req, completion of either
EVENTS = ("virtio_blk_handle_read", "virtio_blk_handle_write", "virtio_blk_rw_complete")
SCSI_EVENTS = ("scsi_req_parsed", "scsi_req_parsed_lba", "scsi_req_dequeue")
ALL_EVENTS = EVENTS + SCSI_EVENTS
SCSI_READ = frozenset({0x08, 0x28, 0xA8, 0x88})  # READ(6), (10), (12), (16)
SCSI_WRITE = frozenset({0x0A, 0x2A, 0xAA, 0x8A, 0x2E, 0xAE, 0x8E})  # WRITE(6/10/12/16), WRITE AND VERIFY(10/12/16)
SCSI_KEY = 1 << 62  # above every user-space pointer: a (target, lun) group, not a virtio-blk device
MAX_LINE = 256
SECTOR = 512
MAX_SIZE = 1 << 32  # one request's bytes at most (virtio-blk and SCSI lengths are 32-bit)
MAX_END = 1 << 62  # a request's end offset at most (what a workload file's offset span may be)
_PTR = r"0x[0-9a-f]{1,16}|\(nil\)"
_HEAD = rb"(?P<pid>[0-9]{1,10})@(?P<sec>[0-9]{1,12})\.(?P<usec>[0-9]{6}):"
_SUBMIT = re.compile(_HEAD + rb"virtio_blk_handle_(?P<dir>read|write) vdev (?P<vdev>" + _PTR.encode() + rb") req (?P<req>"
                     + _PTR.encode() + rb") sector (?P<sector>[0-9]{1,20}) nsectors (?P<n>[0-9]{1,10})")
_DONE = re.compile(_HEAD + rb"virtio_blk_rw_complete vdev (?P<vdev>" + _PTR.encode() + rb") req (?P<req>"
                   + _PTR.encode() + rb") ret (?P<ret>-?[0-9]{1,10})")
_SCSI_ID = rb"target (?P<target>[0-9]{1,5}) lun (?P<lun>[0-9]{1,5}) tag (?P<tag>-?[0-9]{1,10})"
_SCSI_PARSED = re.compile(_HEAD + rb"scsi_req_parsed " + _SCSI_ID
                          + rb" command (?P<cmd>[0-9]{1,3}) dir (?P<dir>[0-9]) length (?P<len>-?[0-9]{1,10})")
_SCSI_LBA = re.compile(_HEAD + rb"scsi_req_parsed_lba " + _SCSI_ID + rb" command (?P<cmd>[0-9]{1,3}) lba (?P<lba>[0-9]{1,20})")
_SCSI_DEQUEUE = re.compile(_HEAD + rb"scsi_req_dequeue " + _SCSI_ID)
_UNTIMED = re.compile(rb"(?:virtio_blk_(?:handle_(?:read|write)|rw_complete)|scsi_req_(?:parsed|parsed_lba|dequeue)) ")
_OURS = re.compile(rb"virtio_blk_|scsi_req_(?:parsed|dequeue)")


def scsi_key(target: int, lun: int) -> int:
    """The device key of a SCSI (target, lun) in :attr:`Request.vdev`."""
    return SCSI_KEY | (target << 16) | lun


def device_name(vdev: int) -> str:
    if vdev & SCSI_KEY:
        return f"SCSI target {(vdev >> 16) & 0xFFFF} lun {vdev & 0xFFFF}"
    return f"device 0x{vdev:x}"


def _ptr(raw: bytes) -> int:
    return 0 if raw == b"(nil)" else int(raw, 16)


@dataclass(frozen=True)
class Request:
    """One guest request: when it was submitted and completed (s), its device, direction, offset and size."""

    t_submit: float
    t_done: float | None
    vdev: int
    write: bool
    offset: int
    size: int


@dataclass
class TraceReader:
    """Pairs submissions with completions by (vdev, req); bounded by ``max_events`` requests."""

    pid: int
    max_events: int = 2_000_000
    window: tuple[float, float] | None = None  # (first, last) wall-clock second an event may carry; else skipped
    scsi_blocks: dict[tuple[int, int], int] = field(default_factory=dict)  # (target, lun) -> block size (else 512)
    requests: list[Request] = field(default_factory=list)
    skipped: int = 0  # lines that looked like our events but did not match whole, were too long, or out of range
    untimed: int = 0  # our events without the PID@time prefix (QEMU without -msg timestamp=on)
    foreign: int = 0  # events of another PID in the same file
    failed: int = 0  # completions with ret != 0
    dropped: int = 0  # requests past max_events
    _open: dict[tuple[int, int], tuple[float, bool, int, int]] = field(default_factory=dict)
    _scsi: dict[tuple[int, int, int], tuple[float, bool, int | None, int]] = field(default_factory=dict)
    _partial: bytes = b""

    @property
    def full(self) -> bool:
        return len(self.requests) >= self.max_events

    def feed(self, chunk: bytes) -> None:
        """Bytes appended to the file since the last call; a line cut at the end waits for its rest."""
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        if len(self._partial) > MAX_LINE:
            self._partial = b""
            self.skipped += 1
        for line in lines:
            self.line(line)

    def _time(self, m: re.Match[bytes]) -> float | None:
        """The event's time, or None (counted as skipped) outside the capture's window: a line someone else wrote
        into the file may carry any time, and one far off would stretch every interval and the iolog."""
        t = int(m["sec"]) + int(m["usec"]) / 1e6
        if self.window is not None and not self.window[0] <= t <= self.window[1]:
            self.skipped += 1
            return None
        return t

    def _in_range(self, offset: int, size: int) -> bool:
        if 0 <= size <= MAX_SIZE and offset + size <= MAX_END:
            return True
        self.skipped += 1
        return False

    def _keep(self, sub: tuple[float, bool, int, int], vdev: int, t: float) -> None:
        if t < sub[0]:  # completed before it was submitted: not a real pair
            self.skipped += 1
            return
        if self.full:
            self.dropped += 1
            return
        self.requests.append(Request(sub[0], t, vdev, sub[1], sub[2], sub[3]))

    def _scsi_line(self, line: bytes) -> bool:
        """A SCSI event (True), or not one (False: the caller goes on)."""
        m = _SCSI_PARSED.fullmatch(line) or _SCSI_LBA.fullmatch(line) or _SCSI_DEQUEUE.fullmatch(line)
        if m is None:
            return False
        if int(m["pid"]) != self.pid:
            self.foreign += 1
            return True
        t = self._time(m)
        if t is None:
            return True
        target, lun = int(m["target"]), int(m["lun"])
        key = (target, lun, int(m["tag"]))
        if target > 0xFFFF or lun > 0xFFFF:
            self.skipped += 1
        elif m.re is _SCSI_PARSED:
            cmd, length = int(m["cmd"]), int(m["len"])
            if (cmd in SCSI_READ or cmd in SCSI_WRITE) and length > 0 and self._in_range(0, length):
                if len(self._scsi) >= 65536:
                    self._scsi.clear()
                self._scsi[key] = (t, cmd in SCSI_WRITE, None, length)
            else:
                self._scsi.pop(key, None)  # not a read or write (a flush, an inquiry): its dequeue is not one
        elif m.re is _SCSI_LBA:
            sub = self._scsi.get(key)
            offset = int(m["lba"]) * self.scsi_blocks.get((target, lun), SECTOR)
            if sub is not None and sub[2] is None:
                if self._in_range(offset, sub[3]):
                    self._scsi[key] = (sub[0], sub[1], offset, sub[3])
                else:
                    del self._scsi[key]
        else:
            done = self._scsi.pop(key, None)
            if done is not None and done[2] is not None:
                self._keep((done[0], done[1], done[2], done[3]), scsi_key(target, lun), t)
        return True

    def line(self, line: bytes) -> None:
        if len(line) > MAX_LINE:
            if _OURS.search(line):
                self.skipped += 1
            return
        if not _OURS.search(line):
            return
        if b"scsi_req_" in line and self._scsi_line(line):
            return
        m = _SUBMIT.fullmatch(line)
        if m is not None:
            if int(m["pid"]) != self.pid:
                self.foreign += 1
                return
            t = self._time(m)
            offset, size = int(m["sector"]) * SECTOR, int(m["n"]) * SECTOR
            if t is None or not self._in_range(offset, size):
                return
            key = (_ptr(m["vdev"]), _ptr(m["req"]))
            if len(self._open) >= 65536:  # completions that never came: bounded
                self._open.clear()
            self._open[key] = (t, m["dir"] == b"write", offset, size)
            return
        m = _DONE.fullmatch(line)
        if m is not None:
            if int(m["pid"]) != self.pid:
                self.foreign += 1
                return
            t = self._time(m)
            if t is None:
                return
            key = (_ptr(m["vdev"]), _ptr(m["req"]))
            sub = self._open.pop(key, None)
            if sub is None:
                return  # submitted before the capture started
            if int(m["ret"]) != 0:
                self.failed += 1
            self._keep(sub, key[0], t)
            return
        if _UNTIMED.search(line) and not re.match(rb"[0-9]{1,10}@", line):
            self.untimed += 1
        else:
            self.skipped += 1


def by_device(requests: Iterable[Request]) -> dict[int, list[Request]]:
    out: dict[int, list[Request]] = {}
    for r in requests:
        out.setdefault(r.vdev, []).append(r)
    return out
