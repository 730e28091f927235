"""One capture: trace events and latency histograms switched on over the guest's QMP, blockstats at 1 Hz, and
everything switched back at the end, on SIGINT/SIGTERM, or (after a SIGKILL) by the next ``capture`` or ``doctor``.

Before it changes anything, a capture writes a marker into the work directory naming the QEMU (pid and start
time, so a reused pid is not mistaken for it), the events it enables and the disks whose histograms it sets;
:func:`restore_leftovers` reads such markers (kvmtune's own files, still checked) and undoes what they name.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kvmtune.capture.blktrace import BlkTrace, block_device, held_by, remove_stale_scratch, scratch_for, teardown
from kvmtune.capture.libvirt import LibvirtGuest, LogFollower, log_path, target_of
from kvmtune.capture.trace import ALL_EVENTS, EVENTS, SCSI_EVENTS, Request, TraceReader, by_device, device_name
from kvmtune.capture.workload import StatsDelta, unique_keys
from kvmtune.errors import KvmtuneError
from kvmtune.host.process import read_pid_stat
from kvmtune.host.root import HostReadError, HostRoot
from kvmtune.live.sources import Sampler
from kvmtune.qemu.qmp import Qmp
from kvmtune.runner import Runner
from kvmtune.textsafe import safe

MARKER_PREFIX = "capture-active-"
HISTOGRAM_NS = [10_000, 100_000, 1_000_000, 10_000_000, 100_000_000]
READ_CHUNK = 4 * 1024 * 1024  # stderr bytes read (and parsed) at once at most
DRAIN_MAX = 64 * 1024 * 1024  # bytes read in one drain at most: a writer faster than the parser still yields the loop
POLL_S = 0.1  # the trace stream is read this often between the 1 Hz blockstats reads (virtlogd rotates its log)
WINDOW_SLACK = 5.0  # s an event's time may lie before the capture's start or after its planned end (+60 s)
_MARKER = re.compile(r"capture-active-[0-9]{1,10}(?:-[0-9a-f]{16})?\.json")
# what QEMU names a device by in query-blockstats (an id, or a QOM path such as
# /machine/peripheral-anon/device[0]/virtio-backend): anything else is neither sent back nor written to a marker
_QDEV = re.compile(r"[A-Za-z0-9_./\[\]-]{1,200}")
# a disk's name as a workload file holds it (a drive id, a qdev path, a libvirt target): anything else from a QMP
# reply is not a disk kvmtune names (nor prints, nor writes into a file it could not read back)
_DISK = re.compile(r"[A-Za-z0-9_#./\[\]:-]{1,100}")


class Monitor(Protocol):
    """A guest's QMP: its own socket (:class:`~kvmtune.qemu.qmp.Qmp`) or through libvirt
    (:class:`~kvmtune.capture.libvirt.LibvirtMonitor`)."""

    def execute(self, cmd: str, **args: Any) -> Any: ...

    def close(self) -> None: ...


class Lines(Protocol):
    def read(self, limit: int, /) -> bytes: ...

    def close(self) -> None: ...


def _bounded_int(v: Any, hi: int = 1 << 62) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= hi else 0


def blockstats(qmp: Monitor, aliases: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """``query-blockstats`` per disk name (a libvirt guest's: its target, found by ``aliases``; else its drive id,
    else its qdev path), the counters bounded; a name given twice keeps its first entry, one out of pattern
    (:data:`_DISK`) is left out."""
    out: dict[str, dict[str, Any]] = {}
    reply = qmp.execute("query-blockstats")
    for entry in reply if isinstance(reply, list) else []:
        if not isinstance(entry, dict):
            continue
        qdev = entry.get("qdev") if isinstance(entry.get("qdev"), str) else None
        name = (target_of(qdev, aliases) if aliases else None) or entry.get("device") or qdev
        st = entry.get("stats")
        if isinstance(name, str) and _DISK.fullmatch(name) and name not in out and isinstance(st, dict):
            out[name] = {"qdev": qdev if qdev and _QDEV.fullmatch(qdev) else None,
                         "histogram": "rd_latency_histogram" in st or "wr_latency_histogram" in st,
                         **{k: _bounded_int(st.get(k)) for k in (
                             "rd_operations", "wr_operations", "flush_operations", "unmap_operations", "rd_bytes",
                             "wr_bytes", "rd_total_time_ns", "wr_total_time_ns")}}
    return out


def images(qmp: Monitor, aliases: dict[str, str] | None = None) -> dict[str, str]:
    """``query-block``: each disk's image as QEMU opened it (``inserted.file``), by the names :func:`blockstats`
    gives; a name or file out of shape is left out."""
    out: dict[str, str] = {}
    reply = qmp.execute("query-block")
    for entry in reply if isinstance(reply, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("inserted"), dict):
            continue
        qdev = entry.get("qdev") if isinstance(entry.get("qdev"), str) else None
        name = (target_of(qdev, aliases) if aliases else None) or entry.get("device") or qdev
        file = entry["inserted"].get("file")
        if isinstance(name, str) and _DISK.fullmatch(name) and name not in out and isinstance(file, str) \
                and 0 < len(file) <= 4096:
            out[name] = file
    return out


def delta(a: dict[str, Any], b: dict[str, Any], seconds: float) -> StatsDelta:
    def d(k: str) -> int:
        return max(0, int(b[k]) - int(a[k]))
    return StatsDelta(seconds, d("rd_operations"), d("wr_operations"), d("flush_operations"), d("unmap_operations"),
                      d("rd_bytes"), d("wr_bytes"), d("rd_total_time_ns"), d("wr_total_time_ns"))


def _starttime(host: HostRoot, pid: int) -> int | None:
    st = read_pid_stat(host, pid)
    return None if st is None else st.starttime


def _boot_id(host: HostRoot) -> str:
    text = (host.read_optional("/proc/sys/kernel/random/boot_id") or "").strip()
    return text if re.fullmatch(r"[0-9a-f-]{36}", text) else ""


def identity(host: HostRoot, pid: int) -> dict[str, Any] | None:
    """What tells the QEMU ``pid`` from any later process given the same pid: its start time (clock ticks since
    boot), this boot (a start time repeats across reboots), and its owner's uid; None when it is gone."""
    start = _starttime(host, pid)
    owner = host.owner(f"/proc/{pid}")
    if start is None or owner is None:
        return None
    return {"pid": pid, "starttime": start, "boot_id": _boot_id(host), "uid": owner[0]}


def _same(host: HostRoot, m: dict[str, Any]) -> bool:
    now = identity(host, m["pid"])
    return now is not None and all(now[k] == m[k] for k in ("starttime", "boot_id", "uid"))


def _running(host: HostRoot, m: dict[str, Any]) -> bool:
    """Whether the capture that wrote marker ``m`` still runs (then its marker is not a leftover: undoing it would
    switch its events off under it)."""
    c = m.get("capture")
    if not isinstance(c, dict) or not isinstance(c.get("pid"), int) or isinstance(c.get("pid"), bool):
        return False
    now = identity(host, c["pid"])
    return now is not None and now["starttime"] == c.get("starttime") and now["boot_id"] == m["boot_id"]


def write_marker(workdir: Path, content: dict[str, Any]) -> Path:
    """A new marker under a name no one can have prepared (random), created, never opened through a symbolic link
    or over a file that is there already (another user's, in a shared work directory), readable by this user
    alone."""
    path = workdir / f"{MARKER_PREFIX}{os.getpid()}-{secrets.token_hex(8)}.json"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise KvmtuneError(f"{path}: cannot create the capture marker ({exc.strerror}); nothing changed") from None
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(content))
    return path


def _read_marker(path: Path) -> dict[str, Any] | None:
    """A marker's content when it is this user's own regular file (opened without following a link, then checked
    on the open file, so a swap between a check and the read does not count); None when it is not; ValueError
    (and friends) when its content is not a marker's."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return None  # a symbolic link (ELOOP), gone, or not ours to read
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022 or st.st_size > 65536:
            return None
        m = json.loads(fh.read(65537).decode("utf-8"), object_pairs_hook=unique_keys)
    if not isinstance(m, dict):
        raise ValueError("not an object")
    for k in ("pid", "starttime", "uid"):
        if not isinstance(m.get(k), int) or isinstance(m.get(k), bool):
            raise ValueError(k)
    if not isinstance(m.get("boot_id"), str) or not isinstance(m.get("events"), list) \
            or not isinstance(m.get("histograms"), list):
        raise ValueError("fields")
    return m


def _connect(host: HostRoot, pid: int) -> tuple[Sampler, Qmp | None]:
    """The QMP of the QEMU ``pid``, found and checked as ``top`` and ``why`` find it (its command line's socket,
    owned by the process's own user)."""
    for attempt in range(3):  # under TCG a busy guest's main loop may answer the greeting late
        sampler = Sampler(host, [], only_pids={pid})
        sampler.snapshot()
        qmp = sampler.procs.qmp(pid) if sampler.procs is not None else None
        if qmp is not None or attempt == 2:
            return sampler, qmp
        sampler.close()
        time.sleep(0.5)
    raise AssertionError("unreachable")


def _libvirt_pid(host: HostRoot, name: str) -> int | None:
    text = (host.read_optional(f"/run/libvirt/qemu/{name}.pid") or "").strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 10 else None


def reach(host: HostRoot, pid: int, lv: LibvirtGuest | None) -> tuple[Monitor | None, Callable[[], None],
                                                                        dict[str, str] | None, str]:
    """The QMP of the QEMU ``pid``: its own socket, or through libvirt for a libvirt domain (whose pid file must
    name that same QEMU). Returns the monitor (None: none), how to let it go, a libvirt guest's disks
    (alias -> target) and, with no monitor, why."""
    if lv is None:
        sampler, qmp = _connect(host, pid)
        return qmp, sampler.close, None, "" if qmp is not None else "no usable QMP socket on its command line"
    log_path(lv.name)
    mon, aliases = lv.open()
    if _libvirt_pid(host, lv.name) != pid:
        mon.close()
        return None, lambda: None, None, f"libvirt domain {lv.name} is no longer QEMU pid {pid}"
    return mon, mon.close, aliases, ""


def _undo(qmp: Monitor, events: list[str], histograms: list[str]) -> list[str]:
    done = []
    for ev in events:
        with contextlib.suppress(KvmtuneError, OSError, ValueError):
            qmp.execute("trace-event-set-state", name=ev, enable=False)
            done.append(f"trace event {ev} off")
    for dev in histograms:
        with contextlib.suppress(KvmtuneError, OSError, ValueError):
            qmp.execute("block-latency-histogram-set", id=dev)
            done.append(f"latency histogram of {dev} removed")
    return done


def restore_leftovers(host: HostRoot, workdir: Path) -> list[str]:
    """Undo what a killed capture left switched on; one line per marker saying what was restored (each line
    through textsafe: the doctor prints it as it is)."""
    return [safe(line) for line in _restore(host, workdir)]


def _restore(host: HostRoot, workdir: Path) -> list[str]:
    out: list[str] = []
    with contextlib.suppress(OSError):
        names = sorted(os.listdir(workdir))
        for name in names:
            if not _MARKER.fullmatch(name):
                continue
            path = workdir / name
            try:
                m = _read_marker(path)
                if m is None:
                    out.append(f"{path}: not a capture marker of this user; left alone")
                    continue
                pid = m["pid"]
                events = [e for e in m["events"] if e in ALL_EVENTS]
                hists = [h for h in m["histograms"] if isinstance(h, str) and _QDEV.fullmatch(h)]
                lv = LibvirtGuest.from_marker(m["libvirt"]) if "libvirt" in m else None
            except (OSError, ValueError, KeyError, TypeError, RecursionError, KvmtuneError):
                out.append(f"{path}: unreadable capture marker; removed")
                path.unlink(missing_ok=True)
                continue
            if _running(host, m):
                out.append(f"capture of pid {pid} by kvmtune pid {m['capture']['pid']} still runs; left alone")
                continue
            traced = m.get("blktrace")
            if isinstance(traced, list) and traced:  # the kernel's trace outlives a killed blktrace, QEMU or not
                runner = Runner()
                out += [teardown(runner, d) if isinstance(d, str) else "a blktrace device in the marker is not a "
                        "path; left alone" for d in traced[:16]]
            if not _same(host, m):
                out.append(f"capture of pid {pid} was killed; that QEMU has ended, nothing to restore")
                path.unlink(missing_ok=True)
                continue
            try:
                qmp, close, _, why = reach(host, pid, lv)
            except KvmtuneError as exc:
                qmp, close, why = None, lambda: None, str(exc)
            try:
                if qmp is not None and not _same(host, m):  # it ended while its socket was found: not that QEMU's
                    qmp, why = None, "the process is no longer that QEMU"
                if qmp is None:
                    out.append(f"capture of pid {pid} was killed; its QMP does not answer ({why}), so "
                               f"{', '.join(events) or 'its latency histograms'} may still be on "
                               "(marker kept for the next try)")
                    continue
                done = _undo(qmp, events, hists)
                via = f" (libvirt domain {lv.name})" if lv is not None else ""
                out.append(f"restored after a killed capture of pid {pid}{via}: {'; '.join(done) or 'nothing was on'}")
                path.unlink(missing_ok=True)
            finally:
                close()
    return out + remove_stale_scratch(workdir)


def drain(fh: Lines, reader: TraceReader) -> None:
    """Feed ``reader`` what the trace stream holds now, :data:`READ_CHUNK` at a time, until the stream has no more,
    the reader is full (``--max-events``), or :data:`DRAIN_MAX` bytes were read (the rest comes next time)."""
    done = 0
    while not reader.full and done < DRAIN_MAX:
        data = fh.read(READ_CHUNK)
        if not data:
            return
        reader.feed(data)
        done += len(data)


@dataclass
class CaptureResult:
    seconds: float
    stats: dict[str, StatsDelta]  # per disk, the whole capture
    per_second: dict[str, list[StatsDelta]]
    requests: dict[str, list[Request]] | None  # per disk (attributed), None: no per-request events
    why_not_trace: str = ""
    notes: list[str] = field(default_factory=list)
    per_request_source: str = "trace"  # or "blktrace": the host block device's requests
    restored: list[str] = field(default_factory=list)


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM as Ctrl-C: the ``finally`` that switches the events off runs."""
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt
    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


MATCH = 0.25  # a device pointer's read and write counts within 25 % of a disk's blockstats over the capture
APART = 0.5  # and every other disk's at least 50 % off


def attribute(requests: list[Request], stats: dict[str, StatsDelta]) -> tuple[dict[str, list[Request]] | None, str]:
    """Each device pointer's requests to the one disk whose blockstats read and write counts agree with them (within
    :data:`MATCH`; the capture's first and last seconds make the two differ a little) while every other disk's are
    :data:`APART`, and whose read and write bytes agree too (within :data:`MATCH`); None and why when that cannot be
    done reliably."""
    out: dict[str, list[Request]] = {}
    for vdev, reqs in by_device(requests).items():
        reads = sum(1 for r in reqs if not r.write)
        writes = len(reqs) - reads
        errors = sorted(((abs(d.rd_ops - reads) + abs(d.wr_ops - writes)) / max(1, d.rd_ops + d.wr_ops, len(reqs)), name)
                        for name, d in stats.items())
        if not errors or errors[0][0] > MATCH or (len(errors) > 1 and errors[1][0] < APART):
            near = ", ".join(f"{name} {e:.0%} off" for e, name in errors[:3])
            return None, (f"{device_name(vdev)}'s {len(reqs)} requests do not match one disk's blockstats alone "
                          f"({near}), so per-request events cannot be put on a disk reliably")
        if errors[0][1] in out:
            return None, f"two device pointers match disk {errors[0][1]}; per-request events not attributed"
        d = stats[errors[0][1]]  # the bytes too: counts alone let made-up requests (sizes, offsets) pass for a disk's
        rb = sum(r.size for r in reqs if not r.write)
        wb = sum(r.size for r in reqs if r.write)
        if (abs(d.rd_bytes - rb) + abs(d.wr_bytes - wb)) / max(1, d.rd_bytes + d.wr_bytes, rb + wb) > MATCH:
            return None, (f"{device_name(vdev)}'s {len(reqs)} requests carry {rb + wb} bytes, disk {errors[0][1]}'s "
                          f"blockstats {d.rd_bytes + d.wr_bytes}, so per-request events cannot be put on a disk "
                          "reliably")
        out[errors[0][1]] = reqs
    return out, ""


def _trace_requests(reader: TraceReader, stats: dict[str, StatsDelta],
                    notes: list[str]) -> tuple[dict[str, list[Request]] | None, str]:
    """The trace events' requests per disk (:func:`attribute`), or why not; what the reader skipped into ``notes``."""
    if reader.skipped:
        notes.append(f"{reader.skipped} trace line(s) did not match the event format and were skipped")
    if reader.dropped:
        notes.append(f"{reader.dropped} request(s) past --max-events not kept")
    if reader.untimed:
        return None, (f"{reader.untimed} events came without their PID@time prefix (QEMU runs without -msg "
                      "timestamp=on): no per-request timing")
    return attribute(reader.requests, stats)


def check_device_requests(per_disk: dict[str, list[Request]], stats: dict[str, StatsDelta],
                          devices: dict[str, str]) -> tuple[dict[str, list[Request]] | None, str]:
    """A block device's requests (blktrace) as a disk's when their read and write counts and bytes agree with the
    disk's blockstats (within :data:`MATCH`); None and why when another process's I/O on the device, or the host's
    merging and splitting, makes them differ."""
    for name, reqs in per_disk.items():
        d = stats[name]
        reads = sum(1 for r in reqs if not r.write)
        writes = len(reqs) - reads
        rb = sum(r.size for r in reqs if not r.write)
        wb = len(reqs) and sum(r.size for r in reqs if r.write)
        n_err = (abs(d.rd_ops - reads) + abs(d.wr_ops - writes)) / max(1, d.rd_ops + d.wr_ops, len(reqs))
        b_err = (abs(d.rd_bytes - rb) + abs(d.wr_bytes - wb)) / max(1, d.rd_bytes + d.wr_bytes, rb + wb)
        if n_err > MATCH or b_err > MATCH:
            return None, (f"{devices[name]} saw {len(reqs)} requests of {rb + wb} bytes, disk {name}'s blockstats "
                          f"{d.rd_ops + d.wr_ops} of {d.rd_bytes + d.wr_bytes}: another process uses the device, or "
                          "the host merged or split the guest's requests, so they are not the disk's")
    return per_disk, ""


class Capture:
    """Capture ``seconds`` of the QEMU ``pid``'s disk I/O; ``trace``: also enable its virtio-blk events.
    ``libvirt``: the QEMU is that libvirt domain's, reached through libvirt and read in its log."""

    def __init__(self, host: HostRoot, pid: int, workdir: Path, *, seconds: float, trace: bool,
                 max_events: int = 2_000_000, tick: Callable[[float], None] = time.sleep,
                 require_trace: bool = False, libvirt: LibvirtGuest | None = None,
                 blktrace: BlkTrace | None = None) -> None:
        self.require_trace, self.libvirt, self.blktrace = require_trace, libvirt, blktrace
        self.aliases: dict[str, str] | None = None
        self.host, self.pid, self.workdir, self.seconds = host, pid, workdir, seconds
        self.trace, self.max_events, self.tick = trace, max_events, tick
        self.marker: Path | None = None

    def _stderr(self) -> tuple[Lines | None, str]:
        if self.libvirt is not None:
            where = log_path(self.libvirt.name)
            try:
                return LogFollower(self.host, where), ""
            except HostReadError as exc:
                return None, (f"its log {where} is not a regular file kvmtune can read ({exc.problem}): QEMU's log "
                              "trace backend writes the events to its stderr, which libvirt's virtlogd writes there")
        where = f"/proc/{self.pid}/fd/2"
        target = self.host.readlink(where)
        try:
            before = os.stat(self.host.beneath(where))  # a device is not opened at all: opening one may act
            if not stat.S_ISREG(before.st_mode):
                raise HostReadError(where, "not a regular file; not read")
            fh = self.host.open_regular(where)
        except (HostReadError, OSError) as exc:
            problem = exc.problem if isinstance(exc, HostReadError) else exc.strerror or str(exc)
            return None, (f"its stderr ({target or 'unknown'}) is not a regular file kvmtune can read ({problem}): "
                          "QEMU's log trace backend writes the events there")
        st = os.fstat(fh.fileno())
        owner = self.host.owner(f"/proc/{self.pid}")
        why = ""
        if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            why = "was replaced while being opened"
        elif st.st_mode & 0o022:
            why = f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
        elif owner is None or st.st_uid not in (0, owner[0]):
            why = f"belongs to uid {st.st_uid}, neither root nor QEMU's user"
        if why:
            fh.close()
            return None, (f"its stderr ({target or 'unknown'}) {why}: trace lines in it could have been written by "
                          "anyone, so per-request events are not read from it")
        fh.seek(0, os.SEEK_END)
        return fh, ""

    def _events_available(self, qmp: Monitor) -> tuple[list[str], str]:
        """The events to enable (virtio-blk's, and the SCSI layer's where this QEMU has them), or why none."""
        out: list[str] = []
        why = ""
        for family, pattern in ((EVENTS, "virtio_blk_*"), (SCSI_EVENTS, "scsi_req_*")):
            try:
                reply = qmp.execute("trace-event-get-state", name=pattern)
            except KvmtuneError as exc:
                return [], f"QMP trace-event-get-state failed ({exc})"
            known = ({e.get("name"): e.get("state") for e in reply if isinstance(e, dict)}
                     if isinstance(reply, list) else {})
            on = [e for e in family if known.get(e) == "enabled"]
            if on:
                return [], f"{', '.join(on)} already enabled by someone else; not taken over"
            missing = [e for e in family if e not in known]
            if missing:
                why = why or f"this QEMU has no trace events {', '.join(missing)}"
            elif any(known[e] == "unavailable" for e in family):
                why = why or "its trace events are compiled out (state unavailable)"
            else:
                out += family
        return out, "" if out else why

    def _scsi_layout(self, qmp: Monitor, disks: dict[str, dict[str, Any]]) -> tuple[dict[tuple[int, int], int], str]:
        """Each SCSI disk's (scsi-id, lun) -> logical block size, over ``qom-get``; why not when two of them share a
        (scsi-id, lun) (on two buses or channels: the SCSI events name neither)."""
        out: dict[tuple[int, int], int] = {}
        seen: dict[tuple[int, int], str] = {}
        for name, st in disks.items():
            qdev = st["qdev"]
            try:
                kind = qmp.execute("qom-get", path=qdev, property="type") if qdev else None
                if not isinstance(kind, str) or not kind.startswith("scsi-"):
                    continue
                sid, lun, bs = (qmp.execute("qom-get", path=qdev, property=p)
                                for p in ("scsi-id", "lun", "logical_block_size"))
            except KvmtuneError:
                continue
            if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 0xFFFF for v in (sid, lun)):
                return {}, f"SCSI disk {name}: qom-get gave scsi-id {sid!r} lun {lun!r}"
            key = (sid, lun)
            if key in seen:
                return {}, (f"SCSI disks {seen[key]} and {name} share scsi-id {sid} lun {lun} (on two buses or "
                            "channels) and QEMU's SCSI trace events name no bus, so their requests cannot be told apart")
            seen[key] = name
            ok = isinstance(bs, int) and not isinstance(bs, bool) and 512 <= bs <= 65536 and bs & (bs - 1) == 0
            out[key] = bs if ok else 512
        return out, ""

    def run(self) -> CaptureResult:
        start = identity(self.host, self.pid)
        if start is None:
            raise KvmtuneError(f"pid {self.pid}: gone")
        qmp, close, self.aliases, why = reach(self.host, self.pid, self.libvirt)
        if qmp is not None and identity(self.host, self.pid) != start:  # the pid ended (and was reused) meanwhile
            qmp, why = None, "it ended while its QMP was being found"
        if qmp is None:
            close()
            raise KvmtuneError(f"pid {self.pid}: {why}; nothing captured")
        try:
            return self._run(qmp, start)
        finally:
            close()

    def _loop(self, qmp: Monitor, fh: Lines | None, reader: TraceReader,
              per_second: dict[str, list[StatsDelta]]) -> tuple[dict[str, Any], dict[str, Any], float]:
        """Blockstats each second and the new trace lines, until the time is up, the events are enough, or Ctrl-C
        (SIGTERM): the first and last blockstats and the seconds between them. Interrupted in its wait, it reads
        blockstats once more at once, so that the last read is as close to the events' end as when the time is up
        (else up to a second of requests traced after the last read would make the two disagree)."""
        first, t_first = blockstats(qmp, self.aliases), time.monotonic()
        prev, t_prev = first, t_first
        interrupted = False
        with contextlib.suppress(KeyboardInterrupt):  # a second signal, or one during a read: the last read stands
            while time.monotonic() - t_first < self.seconds and not reader.full and not interrupted:
                try:
                    self._wait(min(1.0, max(0.0, self.seconds - (time.monotonic() - t_first))), fh, reader)
                except KeyboardInterrupt:
                    interrupted = True
                now, t_now = blockstats(qmp, self.aliases), time.monotonic()
                for n in per_second:
                    if n in now and n in prev:
                        per_second[n].append(delta(prev[n], now[n], t_now - t_prev))
                prev, t_prev = now, t_now
                if fh is not None:
                    drain(fh, reader)
        return first, prev, t_prev - t_first

    def _wait(self, seconds: float, fh: Lines | None, reader: TraceReader) -> None:
        """Wait ``seconds`` (through :attr:`tick`) in steps of :data:`POLL_S`, reading the trace stream after each:
        a guest's events come faster than one 4 MiB read a second holds (2 events of about 130 bytes a request:
        a guest at 100,000 IOPS writes 26 MB a second), and virtlogd renames a libvirt guest's log away every
        2 MiB, so a reader that waits a whole second falls behind, or loses a log that was rotated twice."""
        waited = 0.0
        while seconds - waited > 1e-6:  # not a step of a rounding error's length at the end
            step = min(POLL_S, seconds - waited)
            self.tick(step)
            waited += step
            if fh is not None:
                drain(fh, reader)

    def _prepare_trace(self, qmp: Monitor) -> tuple[Lines | None, list[str], dict[tuple[int, int], int], str]:
        """Where the events will be read, which to enable, the SCSI disks' block sizes; or why per-request mode
        cannot be had (refused with --source trace)."""
        events, why_not = self._events_available(qmp)
        scsi: dict[tuple[int, int], int] = {}
        fh: Lines | None = None
        if not why_not:
            scsi, why_not = self._scsi_layout(qmp, blockstats(qmp, self.aliases))
        if not why_not:
            fh, why_not = self._stderr()
        if why_not and self.require_trace:
            raise KvmtuneError(f"pid {self.pid}: per-request mode refused: {why_not}; nothing captured "
                               "(--source blockstats records statistics)")
        return fh, events if fh is not None else [], scsi, why_not

    def _run(self, qmp: Monitor, start: dict[str, Any]) -> CaptureResult:
        why_not = ""
        fh: Lines | None = None
        events: list[str] = []
        scsi: dict[tuple[int, int], int] = {}
        if self.trace:
            fh, events, scsi, why_not = self._prepare_trace(qmp)
        first = blockstats(qmp, self.aliases)
        if not first:
            raise KvmtuneError(f"pid {self.pid}: query-blockstats names no disk")
        devices = self._blktrace_devices(qmp, first) if self.blktrace is not None else {}
        # block-latency-histogram-set takes the device's qdev id or path, not its drive name
        hists = [s["qdev"] for s in first.values() if not s["histogram"] and s["qdev"]]
        me = identity(self.host, os.getpid()) if self.host.is_live else None
        marker = self.marker = write_marker(self.workdir, {
            **start, "events": events, "histograms": hists,
            "capture": {"pid": os.getpid(), "starttime": me["starttime"] if me else None},
            **({"libvirt": self.libvirt.marker()} if self.libvirt else {}),
            **({"blktrace": sorted(set(devices.values()))} if devices else {})})
        now = time.time()  # QEMU's log backend stamps events with the wall clock
        reader = TraceReader(self.pid, self.max_events, (now - WINDOW_SLACK, now + self.seconds + 60 + WINDOW_SLACK),
                             scsi)
        per_second: dict[str, list[StatsDelta]] = {n: [] for n in first}
        notes: list[str] = []
        broke = False
        try:
            with _signals_raise():
                for dev in hists:
                    with contextlib.suppress(KvmtuneError):
                        qmp.execute("block-latency-histogram-set", id=dev, boundaries=HISTOGRAM_NS)
                for ev in events:
                    qmp.execute("trace-event-set-state", name=ev, enable=True)
                if self.blktrace is not None:
                    self.blktrace.start(sorted(set(devices.values())), scratch_for(marker))
                try:
                    first, prev, seconds = self._loop(qmp, fh, reader, per_second)
                except KvmtuneError as exc:  # the guest went away (or its monitor did) mid-capture
                    raise KvmtuneError(f"pid {self.pid}: the capture broke off: {exc}; nothing written") from None
                if reader.full:
                    notes.append(f"stopped at --max-events {self.max_events} requests")
        except BaseException:
            broke = True
            raise
        finally:
            for ev in events:
                with contextlib.suppress(KvmtuneError, OSError, ValueError):
                    qmp.execute("trace-event-set-state", name=ev, enable=False)
            if fh is not None:
                with contextlib.suppress(OSError):
                    time.sleep(0.1)
                    drain(fh, reader)
                    reader.feed(b"\n")
                if isinstance(fh, LogFollower) and fh.lost:
                    notes.append(f"virtlogd renamed the guest's log past its last backup {fh.lost} time(s) between two "
                                 "reads: events may be missing (raise max_size in virtlogd.conf)")
                fh.close()
            for dev in hists:
                with contextlib.suppress(KvmtuneError, OSError, ValueError):
                    qmp.execute("block-latency-histogram-set", id=dev)
            self._stop_blktrace(marker, notes, broke)
        stats = {n: delta(first[n], prev[n], seconds) for n in first if n in prev}
        requests = None
        if fh is not None:
            requests, why_not = _trace_requests(reader, stats, notes)
        if self.blktrace is not None:
            per_device, more = self.blktrace.read(self.max_events)
            notes += more
            per_disk = {name: per_device.get(dev, []) for name, dev in devices.items() if name in stats}
            requests, why_not = check_device_requests(per_disk, stats, devices)
            return CaptureResult(seconds, stats, per_second, requests, why_not, notes, per_request_source="blktrace")
        return CaptureResult(seconds, stats, per_second, requests, why_not, notes)

    def _stop_blktrace(self, marker: Path, notes: list[str], broke: bool) -> None:
        """blktrace stopped (if it ran) and the marker removed, unless the kernel's trace may be left (``doctor``
        tears it down); a capture that ``broke`` off removes blktrace's records now, since nothing will read them."""
        if self.blktrace is None:
            marker.unlink(missing_ok=True)
            return
        halted = self.blktrace.halt()
        if halted:
            notes.append(halted)
        else:
            marker.unlink(missing_ok=True)
        if broke:
            self.blktrace.cleanup()

    def _blktrace_devices(self, qmp: Monitor, disks: dict[str, dict[str, Any]]) -> dict[str, str]:
        """Each disk whose image is a block device, to that device; raises with why blktrace cannot be had."""
        assert self.blktrace is not None
        why = self.blktrace.why_not()
        found: dict[str, str] = {}
        reasons: list[str] = []
        if not why:
            for name, file in images(qmp, self.aliases).items():
                if name not in disks:
                    continue
                node, problem = block_device(file)
                if not problem and not held_by(self.host, self.pid, node):
                    problem = f"its image {file} ({node}) is not open in pid {self.pid}"
                if problem:
                    reasons.append(f"disk {name}: {problem}")
                else:
                    found[name] = node
            why = "" if found else ("; ".join(reasons) or "query-block names no disk image")
        if why:
            raise KvmtuneError(f"pid {self.pid}: --source blktrace refused: {why}; nothing captured "
                               "(--source trace or blockstats record the guest's requests as QEMU sees them)")
        return found
