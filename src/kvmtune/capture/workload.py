"""The workload file ``kvmtune-workload/1``: what one capture saw, per disk; its fio iolog; reading one back.

A disk's figures come from trace events (per request: sizes, offsets, order, depth and timing) or from
``query-blockstats`` deltas (counts and bytes: the mix and the mean size; the depth by Little's law from the total
times). What a source cannot know is ``null``, never guessed. A workload file given to ``--show`` is hostile input:
bounded, duplicate keys refused, every field's type and range checked, every string printed through textsafe.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvmtune.capture.trace import Request
from kvmtune.errors import InputError
from kvmtune.inputs import read_regular
from kvmtune.textsafe import safe

SCHEMA = "kvmtune-workload/1"
MAX_FILE = 4 * 1024 * 1024
MAX_DISKS = 64
SOURCES = ("trace", "blockstats", "blktrace")


@dataclass
class StatsDelta:
    """One disk's ``query-blockstats`` counters over one interval (deltas) and its length in seconds."""

    seconds: float
    rd_ops: int = 0
    wr_ops: int = 0
    flush_ops: int = 0
    unmap_ops: int = 0
    rd_bytes: int = 0
    wr_bytes: int = 0
    rd_ns: int = 0
    wr_ns: int = 0


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return float(s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))])


def size_histogram(sizes: Sequence[int]) -> dict[str, int]:
    """Request counts by size, in power-of-two buckets named by their upper bound in bytes."""
    out: dict[int, int] = {}
    for n in sizes:
        bound = 1 << max(9, (max(n, 1) - 1).bit_length())
        out[bound] = out.get(bound, 0) + 1
    return {str(k): out[k] for k in sorted(out)}


def depth_profile(reqs: Sequence[Request], seconds: float) -> tuple[float | None, float | None]:
    """Mean and time-weighted p95 of the requests in flight (from overlapping submit/complete pairs)."""
    marks = sorted([(r.t_submit, 1) for r in reqs if r.t_done is not None]
                   + [(r.t_done, -1) for r in reqs if r.t_done is not None])
    if not marks or seconds <= 0:
        return None, None
    time_at: dict[int, float] = {}
    depth, last = 0, marks[0][0]
    for t, step in marks:
        time_at[depth] = time_at.get(depth, 0.0) + (t - last)
        depth, last = depth + step, t
    total = sum(time_at.values())
    mean = sum(d * w for d, w in time_at.items()) / total if total > 0 else None
    acc, p95 = 0.0, None
    for d in sorted(time_at):
        acc += time_at[d]
        if total > 0 and acc >= 0.95 * total:
            p95 = float(d)
            break
    return (None if mean is None else round(mean, 3)), p95


def _sequential(reqs: Sequence[Request]) -> float | None:
    if not reqs:
        return None
    end: dict[bool, int] = {}
    hits = 0
    for r in sorted(reqs, key=lambda r: r.t_submit):
        if end.get(r.write) == r.offset:
            hits += 1
        end[r.write] = r.offset + r.size
    return round(hits / len(reqs), 4)


def _trace_iops(submits: Sequence[float], seconds: float) -> float | None:
    """Requests per second over the span of their own submissions: the events run from the moment they are switched
    on to the moment they are switched off, a little longer than the blockstats interval (``seconds``), so a count
    over ``seconds`` would overstate the rate the requests came at (and that a timed replay of the log reproduces).
    ``seconds`` only for fewer than two requests or a span of 0."""
    if len(submits) >= 2 and submits[-1] > submits[0]:
        return round((len(submits) - 1) / (submits[-1] - submits[0]), 2)
    return round(len(submits) / seconds, 2) if seconds > 0 else None


def from_trace(target: str, reqs: Sequence[Request], stats: StatsDelta, *, anonymize: bool = False,
               source: str = "trace") -> dict[str, Any]:
    """One disk's entry from its per-request records (QEMU's trace events, or ``source`` blktrace: the host device's
    requests); flushes and discards from its blockstats (no trace event for them)."""
    reads = sum(1 for r in reqs if not r.write)
    writes = len(reqs) - reads
    sizes = [r.size for r in reqs]
    submits = sorted(r.t_submit for r in reqs)
    gaps = [(b - a) * 1e6 for a, b in itertools.pairwise(submits)]
    lat = [(r.t_done - r.t_submit) * 1e6 for r in reqs if r.t_done is not None]
    mean, p95 = depth_profile(reqs, stats.seconds)
    lo = min((r.offset for r in reqs), default=0)
    hi = max((r.offset + r.size for r in reqs), default=0)
    return {
        "target": target, "source": source, "seconds": round(stats.seconds, 3),
        "ops": {"read": reads, "write": writes, "flush": stats.flush_ops, "discard": stats.unmap_ops},
        "read_fraction": round(reads / len(reqs), 4) if reqs else None,
        "iops": _trace_iops(submits, stats.seconds),
        "size_bytes": {"p50": percentile(sizes, 0.5), "mean": round(sum(sizes) / len(sizes), 1) if sizes else None,
                       "histogram": size_histogram(sizes)},
        "sequential_fraction": _sequential(reqs),
        "queue_depth": {"mean": mean, "p95": p95},
        "flush_per_write": round(stats.flush_ops / writes, 4) if writes else None,
        "offset_span_bytes": hi - lo,
        "offset_base": 0 if anonymize else None,
        "inter_arrival_us": {q: percentile(gaps, v) for q, v in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))},
        "latency_us": {q: percentile(lat, v) for q, v in (("p50", 0.5), ("p99", 0.99))},
    }


def from_stats(target: str, total: StatsDelta, per_second: Sequence[StatsDelta]) -> dict[str, Any]:
    """One disk's entry from blockstats alone: sizes only as a mean, depth by Little's law, no order."""
    ops = total.rd_ops + total.wr_ops
    depths = [(d.rd_ns + d.wr_ns) / (d.seconds * 1e9) for d in per_second if d.seconds > 0]
    s = total.seconds
    return {
        "target": target, "source": "blockstats", "seconds": round(s, 3),
        "ops": {"read": total.rd_ops, "write": total.wr_ops, "flush": total.flush_ops, "discard": total.unmap_ops},
        "read_fraction": round(total.rd_ops / ops, 4) if ops else None,
        "iops": round(ops / s, 2) if s > 0 else None,
        "size_bytes": {"p50": None, "mean": round((total.rd_bytes + total.wr_bytes) / ops, 1) if ops else None,
                       "histogram": None},
        "sequential_fraction": None,
        "queue_depth": {"mean": round((total.rd_ns + total.wr_ns) / (s * 1e9), 3) if s > 0 else None,
                        "p95": round(p, 3) if (p := percentile(depths, 0.95)) is not None else None},
        "flush_per_write": round(total.flush_ops / total.wr_ops, 4) if total.wr_ops else None,
        "offset_span_bytes": None,
        "offset_base": None,
        "inter_arrival_us": {"p50": None, "p90": None, "p99": None},
        "latency_us": {"p50": None, "p99": None},
    }


def iolog(target: str, reqs: Sequence[Request], *, anonymize: bool = False) -> str:
    """fio's iolog version 3: a file is added, opened, then ``TIME_US FILE ACTION OFFSET LENGTH`` per request (µs, the
    unit fio 3.33's own ``write_iolog`` writes and its replay sleeps by: docs/capture.md)."""
    if not reqs:
        return ""
    base = min(r.offset for r in reqs) if anonymize else 0
    t0 = min(r.t_submit for r in reqs)
    name = "disk0"  # the replay names its own file; the guest's target never becomes a path
    out = ["fio version 3 iolog", f"0 {name} add", f"0 {name} open"]
    for r in sorted(reqs, key=lambda r: r.t_submit):
        out.append(f"{round((r.t_submit - t0) * 1_000_000)} {name} {'write' if r.write else 'read'} {r.offset - base} {r.size}")
    out.append(f"{round((max(r.t_submit for r in reqs) - t0) * 1_000_000)} {name} close")
    _ = target
    return "\n".join(out) + "\n"


# --- reading one back --------------------------------------------------------------------------------------


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' ``object_pairs_hook`` for capture's inputs (workload files, markers, QMP through libvirt): a
    key given twice is an error, not the last one winning."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _num(where: str, v: Any, *, lo: float = 0, hi: float = 1e18, null: bool = True) -> float | None:
    if v is None and null:
        return None
    # an int beyond a float's range (JSON allows 400 digits) is refused here, before math.isfinite overflows on it
    if (isinstance(v, bool) or not isinstance(v, int | float) or (isinstance(v, int) and not -(1 << 63) <= v <= 1 << 63)
            or not math.isfinite(v) or not lo <= v <= hi):
        raise ValueError(f"{where}: {safe(repr(v))[:60]} is not a number in [{lo:g}, {hi:g}]")
    return float(v)


def _text(where: str, v: Any, limit: int = 200) -> str:
    if not isinstance(v, str) or len(v) > limit:
        raise ValueError(f"{where}: not a string of at most {limit} characters")
    if any("\ud800" <= c <= "\udfff" for c in v):  # a lone surrogate (JSON's \\ud800) cannot be printed as UTF-8
        raise ValueError(f"{where}: holds a lone UTF-16 surrogate")
    return v


def _obj(where: str, v: Any, keys: Sequence[str]) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise ValueError(f"{where}: not an object")
    missing = [k for k in keys if k not in v]
    if missing:
        raise ValueError(f"{where}: lacks {', '.join(missing)}")
    return v


def _pick(v: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    return {k: v[k] for k in keys if k in v}


DISK_KEYS = ("target", "source", "seconds", "ops", "read_fraction", "iops", "size_bytes", "sequential_fraction",
             "queue_depth", "flush_per_write", "offset_span_bytes", "offset_base", "inter_arrival_us", "latency_us")


def check_workload(doc: Any) -> dict[str, Any]:
    """``doc`` as a workload file, every field checked; ValueError naming the first problem. Returns what was
    checked, and only that: a key this schema does not have (at any level) is left out, so nothing unchecked (a
    nesting deeper than a printer recurses, text no one looked at) reaches ``--show --format json`` or a replay."""
    doc = _obj("the file", doc, ("schema", "guest", "captured_at", "disks"))
    if doc["schema"] != SCHEMA:
        raise ValueError(f"schema is {safe(repr(doc['schema']))[:60]}, not {SCHEMA!r}")
    _text("guest", doc["guest"])
    _text("captured_at", doc["captured_at"], 40)
    disks = doc["disks"]
    if not isinstance(disks, list) or not 1 <= len(disks) <= MAX_DISKS:
        raise ValueError(f"disks: not a list of 1 to {MAX_DISKS} disks")
    for i, d in enumerate(disks):
        w = f"disks[{i}]"
        _obj(w, d, ("target", "source", "seconds", "ops", "read_fraction", "iops", "size_bytes",
                    "sequential_fraction", "queue_depth", "flush_per_write", "offset_span_bytes", "inter_arrival_us"))
        _text(f"{w}.target", d["target"], 100)
        if d["source"] not in SOURCES:
            raise ValueError(f"{w}.source: not one of {', '.join(SOURCES)}")
        _num(f"{w}.seconds", d["seconds"], lo=0, hi=86400, null=False)
        ops = _obj(f"{w}.ops", d["ops"], ("read", "write", "flush", "discard"))
        for k in ("read", "write", "flush", "discard"):
            v = ops[k]
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 10**15:
                raise ValueError(f"{w}.ops.{k}: not a count")
        _num(f"{w}.read_fraction", d["read_fraction"], hi=1)
        _num(f"{w}.iops", d["iops"], hi=1e9)
        size = _obj(f"{w}.size_bytes", d["size_bytes"], ("p50", "mean", "histogram"))
        _num(f"{w}.size_bytes.p50", size["p50"], hi=1 << 40)
        _num(f"{w}.size_bytes.mean", size["mean"], hi=1 << 40)
        hist = size["histogram"]
        if hist is not None:
            if not isinstance(hist, dict) or len(hist) > 64:
                raise ValueError(f"{w}.size_bytes.histogram: not an object of at most 64 buckets")
            for k, v in hist.items():
                if (not (k.isascii() and k.isdigit() and len(k) <= 14) or isinstance(v, bool) or not isinstance(v, int)
                        or not 0 <= v <= 10**15):
                    raise ValueError(f"{w}.size_bytes.histogram: bucket {safe(k)[:30]!r} is not bytes -> a count")
        _num(f"{w}.sequential_fraction", d["sequential_fraction"], hi=1)
        depth = _obj(f"{w}.queue_depth", d["queue_depth"], ("mean", "p95"))
        _num(f"{w}.queue_depth.mean", depth["mean"], hi=1 << 20)
        _num(f"{w}.queue_depth.p95", depth["p95"], hi=1 << 20)
        _num(f"{w}.flush_per_write", d["flush_per_write"], hi=1e9)
        _num(f"{w}.offset_span_bytes", d["offset_span_bytes"], hi=1 << 62)
        ia = _obj(f"{w}.inter_arrival_us", d["inter_arrival_us"], ("p50", "p90", "p99"))
        for k in ("p50", "p90", "p99"):
            _num(f"{w}.inter_arrival_us.{k}", ia[k], hi=1e12)
        # written by every capture, absent from older files' disks: optional, but checked where present
        if d.get("latency_us") is not None:
            lat = _obj(f"{w}.latency_us", d["latency_us"], ("p50", "p99"))
            for k in ("p50", "p99"):
                _num(f"{w}.latency_us.{k}", lat[k], hi=1e12)
        _num(f"{w}.offset_base", d.get("offset_base"), hi=1 << 62)
    return {"schema": doc["schema"], "guest": doc["guest"], "captured_at": doc["captured_at"], "disks": [
        {**_pick(d, DISK_KEYS), "ops": _pick(d["ops"], ("read", "write", "flush", "discard")),
         "size_bytes": _pick(d["size_bytes"], ("p50", "mean", "histogram")),
         "queue_depth": _pick(d["queue_depth"], ("mean", "p95")),
         "inter_arrival_us": _pick(d["inter_arrival_us"], ("p50", "p90", "p99")),
         **({"latency_us": _pick(d["latency_us"], ("p50", "p99"))} if d.get("latency_us") is not None else {})}
        for d in disks]}


def load_workload(path: str) -> dict[str, Any]:
    """A workload file read as hostile input; :class:`InputError` (one line naming it) when it is not one."""
    return read_workload(path)[0]


def read_workload(path: str) -> tuple[dict[str, Any], str]:
    """:func:`load_workload`'s document and the sha256 of the very bytes it was read from (what a replay records)."""
    raw = read_regular(path, MAX_FILE, " (a workload file)")
    return parse_workload(path, raw), hashlib.sha256(raw).hexdigest()


def parse_workload(path: str, raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=unique_keys,
                         parse_constant=lambda c: (_ for _ in ()).throw(ValueError(f"{c} is not JSON")))
        return check_workload(doc)
    except UnicodeDecodeError:
        raise InputError(path, "not UTF-8 text") from None
    except RecursionError:
        raise InputError(path, "nested too deeply") from None
    except ValueError as exc:
        raise InputError(path, f"not a {SCHEMA} file: {safe(str(exc).splitlines()[0] if str(exc) else exc)}") from None


def _fmt(v: Any, unit: str = "", scale: float = 1.0) -> str:
    if v is None:
        return "not known"
    return f"{v / scale:.4g}{unit}"


def render(doc: dict[str, Any]) -> str:
    """The workload for a person; every string from the file through textsafe."""
    lines = [f"workload of {safe(doc['guest'])}, captured {safe(doc['captured_at'])} ({SCHEMA})"]
    for d in doc["disks"]:
        ops = d["ops"]
        lines.append(f"disk {safe(d['target'])}: {d['seconds']:g} s from {d['source']}")
        lines.append(f"  ops        read {ops['read']}, write {ops['write']}, flush {ops['flush']}, "
                     f"discard {ops['discard']}; {_fmt(d['iops'])} IOPS")
        lines.append(f"  mix        read fraction {_fmt(d['read_fraction'])}, flush per write {_fmt(d['flush_per_write'])}")
        size = d["size_bytes"]
        lines.append(f"  size       p50 {_fmt(size['p50'], ' KiB', 1024)}, mean {_fmt(size['mean'], ' KiB', 1024)}")
        if size["histogram"]:
            total = sum(size["histogram"].values()) or 1
            for k, v in size["histogram"].items():
                lines.append(f"    ≤{int(k) / 1024:>8g} KiB {v / total:6.1%} {'#' * round(40 * v / total)}")
        lines.append(f"  pattern    sequential fraction {_fmt(d['sequential_fraction'])}, offset span "
                     f"{_fmt(d['offset_span_bytes'], ' MiB', 2**20)}")
        q = d["queue_depth"]
        lines.append(f"  depth      mean {_fmt(q['mean'])}, p95 {_fmt(q['p95'])}"
                     + (" (Little's law on blockstats)" if d["source"] == "blockstats" else ""))
        ia = d["inter_arrival_us"]
        lines.append(f"  arrivals   p50 {_fmt(ia['p50'], ' µs')}, p90 {_fmt(ia['p90'], ' µs')}, p99 {_fmt(ia['p99'], ' µs')}")
    return "".join(safe(line) + "\n" for line in lines)
