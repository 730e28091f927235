"""QEMU's virtio-blk trace events as its ``log`` backend writes them on stderr, read as hostile input.

With ``-msg timestamp=on`` each event is one line, ``PID@SECONDS.MICROS:EVENT ARGS``, e.g.
``18303@1796203488.513378:virtio_blk_handle_read vdev 0x55be… req 0x7f… sector 0 nsectors 8``. A line longer than
:data:`MAX_LINE`, or one the strict patterns below do not match whole, is skipped and counted, never interpreted;
only numbers are kept (offsets, sizes, times, the device and request pointers as integers), never data.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

# QEMU 7.2's names (qemu-system-x86_64 -trace help): submissions keyed by req, completion of either
EVENTS = ("virtio_blk_handle_read", "virtio_blk_handle_write", "virtio_blk_rw_complete")
MAX_LINE = 256
SECTOR = 512
_PTR = r"0x[0-9a-f]{1,16}|\(nil\)"
_HEAD = rb"(?P<pid>[0-9]{1,10})@(?P<sec>[0-9]{1,12})\.(?P<usec>[0-9]{6}):"
_SUBMIT = re.compile(_HEAD + rb"virtio_blk_handle_(?P<dir>read|write) vdev (?P<vdev>" + _PTR.encode() + rb") req (?P<req>"
                     + _PTR.encode() + rb") sector (?P<sector>[0-9]{1,20}) nsectors (?P<n>[0-9]{1,10})")
_DONE = re.compile(_HEAD + rb"virtio_blk_rw_complete vdev (?P<vdev>" + _PTR.encode() + rb") req (?P<req>"
                   + _PTR.encode() + rb") ret (?P<ret>-?[0-9]{1,10})")
_UNTIMED = re.compile(rb"virtio_blk_(?:handle_(?:read|write)|rw_complete) ")


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
    requests: list[Request] = field(default_factory=list)
    skipped: int = 0  # lines that looked like our events but did not match whole, or were too long
    untimed: int = 0  # our events without the PID@time prefix (QEMU without -msg timestamp=on)
    foreign: int = 0  # events of another PID in the same file
    failed: int = 0  # completions with ret != 0
    dropped: int = 0  # requests past max_events
    _open: dict[tuple[int, int], tuple[float, bool, int, int]] = field(default_factory=dict)
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

    def line(self, line: bytes) -> None:
        if len(line) > MAX_LINE:
            if b"virtio_blk_" in line:
                self.skipped += 1
            return
        if b"virtio_blk_" not in line:
            return
        m = _SUBMIT.fullmatch(line)
        if m is not None:
            if int(m["pid"]) != self.pid:
                self.foreign += 1
                return
            t = int(m["sec"]) + int(m["usec"]) / 1e6
            key = (_ptr(m["vdev"]), _ptr(m["req"]))
            if len(self._open) >= 65536:  # completions that never came: bounded
                self._open.clear()
            self._open[key] = (t, m["dir"] == b"write", int(m["sector"]) * SECTOR, int(m["n"]) * SECTOR)
            return
        m = _DONE.fullmatch(line)
        if m is not None:
            if int(m["pid"]) != self.pid:
                self.foreign += 1
                return
            key = (_ptr(m["vdev"]), _ptr(m["req"]))
            sub = self._open.pop(key, None)
            if sub is None:
                return  # submitted before the capture started
            if int(m["ret"]) != 0:
                self.failed += 1
            if self.full:
                self.dropped += 1
                return
            t = int(m["sec"]) + int(m["usec"]) / 1e6
            self.requests.append(Request(sub[0], t, key[0], sub[1], sub[2], sub[3]))
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
