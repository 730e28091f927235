"""Replaying a captured workload (``kvmtune-workload/1``, docs/capture.md) on the block tier: fio's job for it.

Two paths, chosen by what the capture had:

- **iolog** (a trace capture's ``FILE.iolog``, for the file's first disk): fio 3.33's nbd engine honours an iolog's
  offsets, and its v3 time stamps in *microseconds* after a stamp that is not 0 (docs/capture.md, "Does fio 3.33's
  nbd engine honour an iolog?"). The captured log is never given to fio: :func:`read_iolog` reads it as hostile
  input and :func:`write_iolog` writes a translated one into kvmtune's own scratch directory, under kvmtune's own
  file name, its stamps in µs shifted by 1, its offsets rebased so the replica need only hold their span.
  ``timed`` keeps the stamps; ``fast`` adds ``--replay_no_stall=1``.
- **statistics** (a blockstats capture, or a disk without a log): a job synthesized from the figures, labelled
  "synthesized from statistics": ``bssplit`` from the size histogram (else the mean size), ``rwmixread``,
  ``percentage_random`` from the sequential fraction, ``iodepth`` from the measured depth, ``rate_iops`` per
  direction in timed mode (``rate`` in bytes with a split of sizes, which fio would rate by its smallest size),
  ``fsync`` from flushes per write.

The workload file is another host's file. It chooses no path and no fio option: every option written here is one of
an allow-list, built by :mod:`kvmtune.qemuopts` from numbers that were range-checked first; the log's path is the
workload file's own name plus ``.iolog`` (the caller's argument, never the file's contents), and the translated log's
path is the caller's scratch directory. This module takes the workload document already checked by
``capture/workload.py``'s reader and checks again each figure it turns into an option (lab/ does not import capture/).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvmtune.errors import InputError
from kvmtune.inputs import read_regular
from kvmtune.lab.storage.fio import Workload
from kvmtune.qemuopts import fio_bssplit, fio_counts, fio_option
from kvmtune.runner import Runner
from kvmtune.textsafe import safe

MODES = ("timed", "fast")
SYNTHESIZED = "synthesized from statistics"
MAX_IOLOG = 256 << 20  # bytes of a captured iolog read (capture's --max-events 2,000,000 writes about 70 MiB)
MAX_EVENTS = 5_000_000
MAX_REQUEST = 64 << 20  # bytes of one request
MAX_OFFSET = 1 << 50
MAX_STAMP_US = 86_400_000_000  # a day
MAX_REPLICA_MIB = 64 << 10  # 64 GiB, sparse: the largest span a replica is made for
BASE_ALIGN = 2 << 20  # rebased offsets keep their place within 2 MiB (qcow2 clusters, huge pages)
MAX_DEPTH = 256
# fio before 3.38 (axboe/fio 704a8cfe, "io_u: Ensure fsync only after write(s)"; 673159e6, e11046bf) asks for its
# fsync=N sync again after every read issued between the Nth write and the next: a mixed job sends about
# 1 / (1 - read fraction) times the syncs asked for (fio 3.33, 70/30: 0.204 a write for fsync=16, docs/capture.md)
FIO_SYNCS_ONLY_AFTER_WRITES = (3, 38)
MAX_FLUSH_PER_WRITE = 16.0  # sync lines a replayed write may bring (a foreign file's figure is bounded to it)
MAX_STREAMS = 8  # fio jobs a timed log is dealt into, at most (each a thread of fio's and an NBD connection)
LOG_NAME = "kvmtune-replay"  # the file name in the translated log: a name only, the nbd engine opens nothing by it
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_FILE_LINE = re.compile(r"(\d{1,12}) (\S{1,64}) (add|open|close)")
_IO_LINE = re.compile(r"(\d{1,12}) (\S{1,64}) (read|write) (\d{1,20}) (\d{1,12})")
HEADER = "fio version 3 iolog"


@dataclass(frozen=True)
class IoEvent:
    """One request of a captured log: microseconds from its start, direction, offset and length in bytes."""

    us: int
    write: bool
    offset: int
    length: int


@dataclass(frozen=True)
class DiskProfile:
    """The figures of one captured disk that a replay uses, each range-checked."""

    target: str
    source: str
    seconds: float
    reads: int
    writes: int
    read_fraction: float | None
    iops: float | None
    size_mean: float | None
    histogram: tuple[tuple[int, int], ...]  # (upper bound in bytes, count)
    sequential_fraction: float | None
    depth_mean: float | None
    depth_p95: float | None
    flush_per_write: float | None
    offset_span: int | None


@dataclass
class Replay:
    """A workload to replay: where it came from (``digest``, the workload file's sha256), how (``mode``), which disk,
    and either a log (``events``) or the statistics a job is synthesized from."""

    digest: str
    mode: str
    profile: DiskProfile
    events: list[IoEvent] | None = None
    log_path: Path | None = None  # the translated log, once written (:meth:`prepare`)
    base: int = 0  # offsets rebased by this many bytes
    notes: list[str] = field(default_factory=list)
    fio_syncs_after_reads: bool = False  # the fio that runs it is older than FIO_SYNCS_ONLY_AFTER_WRITES

    def use_fio_of(self, runner: Runner) -> None:
        """:meth:`use_fio` with the installed fio's ``fio --version`` (through the runner)."""
        done = runner.run(["fio", "--version"], timeout=20)
        self.use_fio(done.stdout if done.ok else None)

    def use_fio(self, version: str | None) -> None:
        """Say which fio runs the replay (``fio --version``'s line): a synthesized mixed job's ``fsync`` is then
        asked for as that fio counts it, so that it sends the captured flushes per write."""
        self.fio_syncs_after_reads = fio_syncs_after_reads(version)
        p = self.profile
        if self.fio_syncs_after_reads and self.events is None and p.reads and p.writes and p.flush_per_write:
            self.notes.append(f"{safe((version or '').strip()[:40])} syncs after reads in a mixed job too (fixed in "
                              "fio 3.38): its fsync is asked for as that fio counts it")

    @property
    def source(self) -> str:
        return "iolog" if self.events is not None else "statistics"

    @property
    def label(self) -> str:
        what = "the captured iolog" if self.events is not None else SYNTHESIZED
        return f"workload of disk {safe(self.profile.target)} ({what}, {self.mode})"

    def record(self) -> dict[str, Any]:
        """What a stored run or a verify result says about the workload."""
        p = self.profile
        return {"digest": self.digest, "source": self.source, "mode": self.mode, "disk": p.target,
                "synthesized": self.events is None,
                "profile": {"captured_by": p.source, "seconds": p.seconds, "iops": p.iops, "reads": p.reads,
                            "writes": p.writes, "read_fraction": p.read_fraction, "size_mean": p.size_mean,
                            "sequential_fraction": p.sequential_fraction, "depth_mean": p.depth_mean,
                            "depth_p95": p.depth_p95, "flush_per_write": p.flush_per_write,
                            "size_histogram": [list(b) for b in p.histogram]}}

    def reads(self) -> bool:
        """Whether the replay reads (its replica is then written whole first: a read of a hole is not a read)."""
        if self.events is not None:
            return any(not e.write for e in self.events)
        return self.profile.reads > 0

    def span(self) -> int:
        """Bytes the replica must hold: the log's rebased reach, else the captured offset span (0: not known)."""
        if self.events:
            return max(e.offset + e.length for e in self.events) - self.base
        return self.profile.offset_span or 0

    def replica_mib(self, minimum: int) -> int:
        """The replica's size in MiB: the span rounded up, at least ``minimum``; a span past 64 GiB is refused."""
        mib = -(-self.span() // (1 << 20))
        if mib > MAX_REPLICA_MIB:
            if self.events is not None:
                raise InputError("--replay", f"the log reaches {mib} MiB past its lowest offset, more than the "
                                             f"{MAX_REPLICA_MIB} MiB a replica is made for")
            self.notes.append(f"offset span {mib} MiB capped at {MAX_REPLICA_MIB} MiB")
            mib = MAX_REPLICA_MIB
        return max(int(minimum), mib)

    def place(self, directory: Path) -> None:
        """Where the translated log will be: ``directory`` (kvmtune's scratch); :meth:`write` writes it there."""
        if self.events is not None:
            self.log_path = directory / f"{LOG_NAME}.iolog"

    def streams(self) -> int:
        """fio jobs the log is dealt into: in timed mode as many as the captured depth (p95, at most
        :data:`MAX_STREAMS`), each at depth 1; else 1. fio 3.33 replays a log's delays from the last request it
        issued and never makes up a request that was late (``iolog_delay``: no sleep when the gap is over, the lag
        kept), so one depth-1 job falls behind wherever requests came closer together than the replica answers them
        (measured: a 406-IOPS capture at depth 4.4 replayed at 211-353 IOPS); dealt round-robin into N jobs, each
        job's gaps are N times the captured ones and up to N requests are in flight, as they were on the guest, each
        reaped as it completes (so its latency is its own)."""
        if self.mode != "timed" or self.events is None:
            return 1
        return max(1, min(MAX_STREAMS, _depth(self.profile), len(self.events)))

    def log_paths(self) -> list[Path]:
        """The translated logs, one a stream (:meth:`streams`), once :meth:`place` has placed them."""
        if self.events is None or self.log_path is None:
            return []
        return [self.log_path] + [self.log_path.with_name(f"{LOG_NAME}-{j}.iolog") for j in range(1, self.streams())]

    def write(self) -> Path | None:
        """Write the translated logs where :meth:`place` put them (nothing for a synthesized job); the first's path.
        Stream j holds requests j, j+N, j+2N … at their captured times."""
        if self.events is None or self.log_path is None:
            return None
        paths = self.log_paths()
        for j, path in enumerate(paths):
            write_iolog(self.events[j::len(paths)], path, self.base, t0=self.events[0].us,
                        flush_per_write=self.profile.flush_per_write)
        return self.log_path

    def prepare(self, directory: Path) -> None:
        """:meth:`place` and :meth:`write` at once."""
        self.place(directory)
        self.write()

    def job_options(self, size_mib: int, seconds: float) -> list[str]:
        """fio's options for the replay (after ``--name`` and the engine), on a replica of ``size_mib``."""
        runtime = fio_option("runtime", f"{max(1, round(seconds * 1000))}ms")
        if self.events is not None:
            if self.log_path is None:
                raise InputError("--replay", "the translated log has no place (place) before the job")
            out = [fio_option("read_iolog", self.log_path), fio_option("iodepth", self.depth()), runtime,
                   fio_option("size", f"{int(size_mib)}m")]
            if self.mode == "fast":
                out.append("--replay_no_stall=1")
            paths = self.log_paths()
            if len(paths) > 1:  # one job a stream, reported as one group (the first job's name)
                out.append("--group_reporting")
                for j, path in enumerate(paths[1:], start=1):
                    out += [fio_option("name", f"{LOG_NAME}-{j}"), fio_option("read_iolog", path),
                            fio_option("iodepth", 1), runtime, fio_option("size", f"{int(size_mib)}m"),
                            "--group_reporting"]
            return out
        return synthesized_options(self.profile, self.mode, size_mib, seconds,
                                   syncs_after_reads=self.fio_syncs_after_reads)

    def depth(self) -> int:
        """fio's iodepth for the log: fast mode at the captured depth; timed mode 1. fio 3.33 replaying a log reaps
        completions only once its queue is full, so at depth N each latency grows by about N inter-arrival gaps
        (measured: 2,000 requests 1 ms apart, p50 25 µs at depth 1, 7.1 ms at 8, 64 ms at 64; docs/capture.md);
        at depth 1 a request waits for the one before it, and fio's delay catches up after it."""
        return _depth(self.profile) if self.mode == "fast" else 1

    def workload(self, size_mib: int, seconds: float) -> Workload:
        """The replay as the block tier's workload (its ``replay`` options replace the generic job's)."""
        p = self.profile
        rw = "randread" if p.writes == 0 else "randwrite" if p.reads == 0 else "randrw"
        return Workload(f"replay-{self.mode}", rw, f"{_mean_bs(p)}", _depth(p),
                        rwmixread=None if rw != "randrw" else _pct(p.read_fraction or 0.0),
                        description=self.label, replay=tuple(self.job_options(size_mib, seconds)))


def _pct(v: float) -> int:
    return max(0, min(100, round(v * 100)))


def _depth(p: DiskProfile) -> int:
    d = p.depth_p95 if p.depth_p95 is not None else p.depth_mean
    return max(1, min(MAX_DEPTH, round(d))) if d is not None else 1


def _mean_bs(p: DiskProfile) -> int:
    mean = p.size_mean if p.size_mean is not None else 4096.0
    return max(512, min(MAX_REQUEST, round(mean / 512) * 512))


def fio_syncs_after_reads(version: str | None) -> bool:
    """Whether the fio of ``version`` (``fio-3.33``) sends a mixed job's fsync after reads too; an unknown version
    is taken as a fixed one (the count then errs low, never a job of syncs)."""
    m = re.fullmatch(r"\s*fio-(\d{1,4})\.(\d{1,4})\S*\s*", version or "")
    return m is not None and (int(m.group(1)), int(m.group(2))) < FIO_SYNCS_ONLY_AFTER_WRITES


def synthesized_options(p: DiskProfile, mode: str, size_mib: int, seconds: float, *,
                        syncs_after_reads: bool = False) -> list[str]:
    """A job from statistics: bssplit (or bs), rwmixread, percentage_random, iodepth, rate_iops (timed), fsync
    (``syncs_after_reads``: for a fio before 3.38, whose mixed job syncs after reads too)."""
    if p.reads + p.writes == 0:
        raise InputError("--replay", f"disk {p.target} did no reads or writes: there is nothing to replay")
    rw = "randread" if p.writes == 0 else "randwrite" if p.reads == 0 else "randrw"
    out = [fio_option("rw", rw)]
    if rw == "randrw":
        out.append(fio_option("rwmixread", _pct(p.read_fraction if p.read_fraction is not None else
                                               p.reads / (p.reads + p.writes))))
    hist = [(b, c) for b, c in p.histogram if c > 0]
    total = sum(c for _, c in hist)
    split: list[tuple[int, int]] = []
    if total:
        split = [(b, round(100 * c / total)) for b, c in hist]
        split = [(b, pct) for b, pct in split if pct > 0] or [(hist[0][0], 100)]
        split[-1] = (split[-1][0], 100 - sum(pct for _, pct in split[:-1]))  # fio wants the percents to add up to 100
    if len(split) > 1:
        out.append(fio_bssplit(split))
    else:
        out.append(fio_option("bs", split[0][0] if split else _mean_bs(p)))
    if p.sequential_fraction is not None:
        out.append(fio_option("percentage_random", _pct(1.0 - p.sequential_fraction)))
    out.append(fio_option("iodepth", _depth(p)))
    if mode == "timed" and p.iops:
        rf = p.read_fraction if p.read_fraction is not None else p.reads / (p.reads + p.writes)
        r, w = p.iops * rf, p.iops * (1 - rf)
        if len(split) > 1:
            # fio turns rate_iops into bytes with the smallest size of a split (measured: 342 of 1,000 IOPS with
            # 4k/33:16k/67), so a split gets its rate in bytes: IOPS × the split's mean size
            mean = sum(b * pct for b, pct in split) / 100
            out.append(fio_counts("rate", [max(1, round(r * mean)) if p.reads else 0,
                                           max(1, round(w * mean)) if p.writes else 0]))
        else:
            out.append(fio_counts("rate_iops", [max(1, round(r)) if p.reads else 0, max(1, round(w)) if p.writes else 0]))
    if p.flush_per_write and p.writes:
        per_write = p.flush_per_write
        if syncs_after_reads and rw == "randrw":  # that fio sends about 1 / (1 - read fraction) syncs per fsync=N
            rf = p.read_fraction if p.read_fraction is not None else p.reads / (p.reads + p.writes)
            per_write *= max(0.0, 1.0 - rf)
        out.append(fio_option("fsync", max(1, min(1 << 20, round(1 / per_write) if per_write > 0 else 1 << 20))))
    out += [fio_option("size", f"{int(size_mib)}m"), fio_option("runtime", f"{max(1, round(seconds * 1000))}ms"),
            "--time_based"]
    return out


# --- the workload document (already checked by capture/workload.py) and the captured log, as hostile input ------


def _number(where: str, v: Any, hi: float, *, null: bool = True) -> float | None:
    if v is None and null:
        return None
    # the range first: an integer too large for a float (10**400) compares, where math.isfinite raises; NaN and
    # infinities fail the range too
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= hi:
        raise InputError("--replay", f"{where} is not a number in [0, {hi:g}]")
    return float(v)


def _count(where: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 10**15:
        raise InputError("--replay", f"{where} is not a count")
    return v


def _part(d: Mapping[str, Any], key: str) -> dict[str, Any]:
    v = d.get(key)
    return v if isinstance(v, dict) else {}


def profile_of(doc: Mapping[str, Any], disk: str | None) -> tuple[DiskProfile, int]:
    """The disk of the workload named ``disk`` (its ``target``), or its only one; (profile, its index)."""
    disks = doc.get("disks")
    if not isinstance(disks, list) or not disks:
        raise InputError("--replay", "the workload file names no disk")
    targets = [d.get("target") if isinstance(d, dict) else None for d in disks]
    if disk is None:
        if len(disks) > 1:
            raise InputError("--replay-disk", f"the workload has {len(disks)} disks: name one")
        i = 0
    elif disk in targets:
        i = targets.index(disk)
    else:
        raise InputError("--replay-disk", f"{disk!r} is not a disk of the workload")
    d = disks[i]
    if not isinstance(d, dict):
        raise InputError("--replay", f"disks[{i}] is not an object")
    w = f"disks[{i}]"
    target = d.get("target")
    if not isinstance(target, str) or not 1 <= len(target) <= 100:
        raise InputError("--replay", f"{w}.target is not a name")
    ops, size, depth = (_part(d, k) for k in ("ops", "size_bytes", "queue_depth"))
    raw_hist = size.get("histogram")
    hist: list[tuple[int, int]] = []
    if raw_hist is not None:
        if not isinstance(raw_hist, dict) or len(raw_hist) > 64:
            raise InputError("--replay", f"{w}.size_bytes.histogram is not at most 64 buckets")
        for k, v in raw_hist.items():
            if not (isinstance(k, str) and k.isascii() and k.isdigit() and 1 <= int(k) <= MAX_REQUEST):
                raise InputError("--replay", f"{w}.size_bytes.histogram has a bucket that is not 1 B to 64 MiB")
            hist.append((int(k), _count(f"{w}.size_bytes.histogram", v)))
    span = _number(f"{w}.offset_span_bytes", d.get("offset_span_bytes"), float(1 << 62))
    source = d.get("source")
    if source not in ("trace", "blockstats", "blktrace"):
        raise InputError("--replay", f"{w}.source is not trace, blockstats or blktrace")
    prof = DiskProfile(
        target=target, source=str(source),
        seconds=_number(f"{w}.seconds", d.get("seconds"), 86400, null=False) or 0.0,
        reads=_count(f"{w}.ops.read", ops.get("read")), writes=_count(f"{w}.ops.write", ops.get("write")),
        read_fraction=_number(f"{w}.read_fraction", d.get("read_fraction"), 1),
        iops=_number(f"{w}.iops", d.get("iops"), 1e9),
        size_mean=_number(f"{w}.size_bytes.mean", size.get("mean"), MAX_REQUEST),
        histogram=tuple(sorted(hist)),
        sequential_fraction=_number(f"{w}.sequential_fraction", d.get("sequential_fraction"), 1),
        depth_mean=_number(f"{w}.queue_depth.mean", depth.get("mean"), 1 << 20),
        depth_p95=_number(f"{w}.queue_depth.p95", depth.get("p95"), 1 << 20),
        flush_per_write=_number(f"{w}.flush_per_write", d.get("flush_per_write"), 1e9),
        offset_span=None if span is None else int(span),
    )
    return prof, i


def read_iolog(path: str | Path) -> list[IoEvent]:
    """A capture's fio iolog v3 (``TIME_US NAME ACTION [OFFSET LENGTH]``, docs/capture.md) read as hostile input:
    bounded, lines split on ``\\n`` only and matched whole (another line break, a tab, a second space, trailing text
    is an error), one file name throughout, only add/open/close/read/write, stamps that never go back, numbers in
    range. :class:`InputError` naming the file and the line."""
    raw = read_regular(str(path), MAX_IOLOG, " (an iolog)")
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise InputError(str(path), "not an ASCII fio iolog") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines or lines[0] != HEADER:
        raise InputError(str(path), f"line 1 is not {HEADER!r}")
    name: str | None = None
    last = 0
    events: list[IoEvent] = []
    for n, line in enumerate(lines[1:], start=2):
        m = _IO_LINE.fullmatch(line) or _FILE_LINE.fullmatch(line)
        if m is None:
            raise InputError(str(path), f"line {n} is not an iolog v3 line kvmtune writes")
        if not _NAME.fullmatch(m.group(2)) or (name is not None and m.group(2) != name):
            raise InputError(str(path), f"line {n} names another file: a replay log holds one disk")
        name = m.group(2)
        us = int(m.group(1))
        if us > MAX_STAMP_US or us < last:
            raise InputError(str(path), f"line {n}: time stamp out of order or past a day")
        last = us
        if m.re is _IO_LINE:
            offset, length = int(m.group(4)), int(m.group(5))
            if offset > MAX_OFFSET or not 1 <= length <= MAX_REQUEST:
                raise InputError(str(path), f"line {n}: offset or length out of range")
            events.append(IoEvent(us, m.group(3) == "write", offset, length))
            if len(events) > MAX_EVENTS:
                raise InputError(str(path), f"more than {MAX_EVENTS} requests")
    if not events:
        raise InputError(str(path), "no read or write to replay")
    return events


def rebase(events: Sequence[IoEvent]) -> int:
    """The bytes a log's offsets are moved down by: the lowest offset, rounded down to 2 MiB."""
    return min(e.offset for e in events) // BASE_ALIGN * BASE_ALIGN


def write_iolog(events: Sequence[IoEvent], dest: Path, base: int, t0: int | None = None,
                flush_per_write: float | None = None) -> Path:
    """The translated log fio replays: kvmtune's file name, µs stamps shifted by 1 (fio 3.33 loses the gap after a
    stamp of 0), offsets less ``base``. Written whole (``O_EXCL``), never over an existing file.

    The captured log has no flushes (QEMU 7.2 has no flush event at the traced level; they are counted from
    blockstats), so ``flush_per_write`` of them go in as ``sync`` lines, each at the stamp of the write it follows:
    one after the write that brings the running sum of ``flush_per_write`` to a whole number (0.25: after every
    fourth write; 2: two after each; at most :data:`MAX_FLUSH_PER_WRITE`). Where the guest flushed is not known,
    only how often per write."""
    out = [HEADER, f"1 {LOG_NAME} add", f"1 {LOG_NAME} open"]
    t0 = events[0].us if t0 is None else t0
    owed = 0.0
    for e in events:
        stamp = e.us - t0 + 1
        out.append(f"{stamp} {LOG_NAME} {'write' if e.write else 'read'} {e.offset - base} {e.length}")
        if e.write and flush_per_write:
            owed += min(flush_per_write, MAX_FLUSH_PER_WRITE)
            while owed >= 1.0 - 1e-9:
                out.append(f"{stamp} {LOG_NAME} sync 0 0")
                owed -= 1.0
    out.append(f"{events[-1].us - t0 + 1} {LOG_NAME} close")
    data = ("\n".join(out) + "\n").encode()
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    return dest


def build_replay(doc: Mapping[str, Any], digest: str, workload_path: str | Path, *, mode: str = "timed",
                 disk: str | None = None) -> Replay:
    """The replay of ``doc`` (a workload file checked by its reader, whose sha256 is ``digest``): its log
    ``WORKLOAD_PATH.iolog`` when the disk is the file's first and was traced and the log is there, else a job
    synthesized from its statistics (a note says why)."""
    if mode not in MODES:
        raise InputError("--replay-mode", f"{mode!r} is not one of {', '.join(MODES)}")
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise InputError("--replay", "the digest is not a sha256")
    try:
        profile, index = profile_of(doc, disk)
    except InputError as exc:
        if exc.where == "--replay-disk":
            raise
        raise InputError(str(workload_path), exc.problem) from None
    log = Path(f"{workload_path}.iolog")
    rep = Replay(digest, mode, profile)
    if profile.source not in ("trace", "blktrace"):
        rep.notes.append(f"{SYNTHESIZED}: the capture of disk {profile.target} has no per-request log")
    elif index != 0:
        rep.notes.append(f"{SYNTHESIZED}: the capture's iolog is of its first disk only")
    elif log.is_symlink():
        raise InputError(str(log), "a symbolic link: the iolog beside a workload file is read only as a regular file")
    elif not log.exists():
        rep.notes.append(f"{SYNTHESIZED}: {log.name} is not beside the workload file")
    else:
        rep.events = read_iolog(log)
        rep.base = rebase(rep.events)
        if profile.flush_per_write:
            rep.notes.append(f"the log has no flushes: {min(profile.flush_per_write, MAX_FLUSH_PER_WRITE):g} a write "
                             "(from blockstats) replayed after the writes, at their times")
    if rep.events is None and profile.reads + profile.writes == 0:
        raise InputError(str(workload_path), f"disk {profile.target} did no reads or writes: there is nothing to replay")
    return rep
