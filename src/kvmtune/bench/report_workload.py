"""A captured workload's profile drawn for the HTML reports: its request-size histogram, its mix (reads, writes,
flushes per write) and its queue depth, from a stored run's ``replay.profile`` (``results report``) or from a
workload file's disk (``kvmtune capture --show FILE --format html``).

Both come from others (a shared results database, a workload file captured elsewhere): every number is checked
(finite, in range, a bounded histogram of increasing bounds), anything else is left out as "–", and every string
goes through ``html_safe``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from kvmtune.bench.svgchart import Bar, BarChart, bar_chart
from kvmtune.textsafe import html_safe

MAX_BUCKETS = 64  # a histogram longer than this is not drawn (the capture writes at most 20)
CSS = ("body{font-family:sans-serif;max-width:1200px;margin:1em auto;padding:0 1em}"
       "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}")


def number(v: Any, lo: float = 0.0, hi: float = 1e15) -> float | None:
    """``v`` as a float when it is a JSON number in [lo, hi]; None otherwise. The range is compared first: an
    integer of 400 digits (JSON and Python allow it) compares exactly, where ``math.isfinite`` or ``float`` of it
    raises ``OverflowError``."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi or not math.isfinite(v):
        return None
    return float(v)


def histogram(raw: Any) -> list[tuple[int, int]]:
    """(upper bound in bytes, count) pairs, bounds increasing, from a list of pairs or a ``{"bound": count}``
    object (the workload file's form); [] when anything in it is not so."""
    items: list[Any]
    if isinstance(raw, Mapping):
        items = list(raw.items())
    elif isinstance(raw, list):
        items = raw
    else:
        return []
    if len(items) > MAX_BUCKETS:
        return []
    out: list[tuple[int, int]] = []
    for item in items:
        if not isinstance(item, list | tuple) or len(item) != 2:
            return []
        bound, count = item
        if isinstance(bound, str) and bound.isdigit() and len(bound) <= 16:
            bound = int(bound)
        if isinstance(bound, bool) or not isinstance(bound, int) or not 0 < bound <= 2**40:
            return []
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= 10**12:
            return []
        if out and bound <= out[-1][0]:
            return []
        out.append((bound, count))
    return out


def _size_label(bound: int) -> str:
    return f"≤{bound // 1024} KiB" if bound >= 1024 and bound % 1024 == 0 else f"≤{bound} B"


def profile_charts(p: Mapping[str, Any], title: str) -> str:
    """The size histogram (share of requests per size bucket) and the mix of one workload's disk, as inline SVG,
    with its depth and rate in a line of text; ``""`` when nothing in ``p`` can be drawn."""
    parts: list[str] = []
    hist = histogram(p.get("size_histogram"))
    total = sum(c for _, c in hist)
    if total:
        xs = [("", "", _size_label(b)) for b, _ in hist]
        bars = {(x, "requests"): Bar(100.0 * c / total) for x, (_, c) in zip(xs, hist, strict=True)}
        parts.append(bar_chart(BarChart(label=f"request sizes of {title}", y_title="share of requests (%)", xs=xs,
                                        series=["requests"], bars=bars, log=False,
                                        level_names=("", "", "request size"))))
    mix = {"reads": number(p.get("read_fraction"), 0.0, 1.0), "flushes per write": number(p.get("flush_per_write"), 0, 1e6),
           "sequential": number(p.get("sequential_fraction"), 0.0, 1.0)}
    if mix["reads"] is not None:
        mix["writes"] = 1.0 - mix["reads"]
    shown = [(k, v) for k, v in mix.items() if v is not None]
    if shown:
        xs = [("", "", k) for k, _ in shown]
        parts.append(bar_chart(BarChart(label=f"mix of {title}", y_title="fraction", xs=xs, series=["fraction"],
                                        bars={(x, "fraction"): Bar(v) for x, (_, v) in zip(xs, shown, strict=True)},
                                        log=False)))
    depth_mean, depth_p95 = number(p.get("depth_mean"), 0, 1e6), number(p.get("depth_p95"), 0, 1e6)
    iops, size_mean = number(p.get("iops"), 0, 1e9), number(p.get("size_mean"), 0, 2**40)
    facts = [f"queue depth mean {depth_mean:.1f}" if depth_mean is not None else "",
             f"p95 {depth_p95:.0f}" if depth_p95 is not None else "",
             f"{iops:.0f} IOPS" if iops is not None else "",
             f"mean size {size_mean / 1024:.1f} KiB" if size_mean is not None else ""]
    line = ", ".join(f for f in facts if f)
    if not parts and not line:
        return ""
    return (f"<h3>{html_safe(title)}</h3>" + (f"<p>{html_safe(line)}</p>" if line else "")
            + "".join(f"<figure>{svg}</figure>" for svg in parts if svg))


def disk_profile(disk: Mapping[str, Any]) -> dict[str, Any]:
    """A workload file's disk (``kvmtune-workload/1``, already checked by ``load_workload``) in the stored
    profile's terms."""
    raw_size, raw_depth = disk.get("size_bytes"), disk.get("queue_depth")
    size: Mapping[str, Any] = raw_size if isinstance(raw_size, Mapping) else {}
    depth: Mapping[str, Any] = raw_depth if isinstance(raw_depth, Mapping) else {}
    return {"iops": disk.get("iops"), "read_fraction": disk.get("read_fraction"),
            "flush_per_write": disk.get("flush_per_write"), "sequential_fraction": disk.get("sequential_fraction"),
            "size_mean": size.get("mean"), "size_histogram": size.get("histogram"),
            "depth_mean": depth.get("mean"), "depth_p95": depth.get("p95")}


def workload_page(doc: Mapping[str, Any]) -> str:
    """``capture --show FILE --format html``: one self-contained page, a section per disk."""
    guest = html_safe(str(doc.get("guest", "?")))
    disks: Sequence[Any] = doc.get("disks") if isinstance(doc.get("disks"), list) else []  # type: ignore[assignment]
    body = "".join(profile_charts(disk_profile(d), f"disk {d.get('target', '?')} ({d.get('source', '?')}, "
                                  f"{d.get('seconds', '?')} s)") for d in disks if isinstance(d, Mapping))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>workload of {guest}</title>"
            f"<style>{CSS}</style></head><body><h1>Workload of {guest}</h1>"
            f"<p>captured {html_safe(str(doc.get('captured_at', '?')))}</p>{body}</body></html>\n")
