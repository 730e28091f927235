"""Pieces of the HTML report that a performance engineer reads first: the summary with a table of seed
claims and verdict badges, grouped bar charts that follow the experiment's dimensions (inline SVG:
self-contained, crisp in print), a chosen baseline, 95 % intervals, and latency percentiles."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from kvmtune.bench.net.claims import NetClaim
from kvmtune.bench.storage.matrix import DIMENSIONS as STORAGE_DIMENSIONS
from kvmtune.bench.svgchart import Bar, BarChart, XKey, bar_chart
from kvmtune.bench.verdicts import Verdict
from kvmtune.lab.metrics import lookup
from kvmtune.lab.stats import median, summarize
from kvmtune.lab.store import CellRow
from kvmtune.lab.vocabulary import INCONCLUSIVE, NOT_MEASURED, WORDS
from kvmtune.textsafe import html_safe

# the dimensions a storage cell varies along, in the order a chart uses them (one list: bench/storage/matrix.py)
DIMENSIONS = tuple(d.field for d in STORAGE_DIMENSIONS)
# (stored metric, unit shown, divisor): the label and direction come from the metrics catalogue
CHART_METRICS = (("iops", "IOPS", 1.0), ("bw_Bps", "MB/s", 1e6), ("lat_mean_us", "µs", 1.0))
PERCENTILES = ("clat_p50_us", "clat_p90_us", "clat_p99_us", "clat_p99.9_us")
BADGE = {word: colour for word, (colour, _meaning) in WORDS.items()}  # every badge word is in the vocabulary

e = html_safe


def seed_figure(claim: str) -> str:
    """The number a seed claim states (``5×``, ``70 %``), or '–'."""
    m = re.search(r"(\d+(?:\.\d+)?)\s*(×|x\b| ?%)", claim)
    return f"{m.group(1)}{'×' if m.group(2) in ('×', 'x') else ' %'}" if m else "–"


def badge(v: Verdict) -> str:
    """The vocabulary word a storage verdict's text settles on (the worst when it names several); a verdict
    without an interval (the guest tier's single figures) is inconclusive."""
    if v.measured is None:
        return NOT_MEASURED
    return v.word()


def claims_table(rows: Sequence[tuple[str, Verdict | NetClaim]]) -> str:
    """One row per seed claim and tier: seed | claim | seed figure | measured here | tier | verdict badge."""
    seen: set[tuple[str, str, str, str | None]] = set()
    out = []
    for tier, v in rows:
        key = (tier, v.seed, v.claim, v.measured)
        if key in seen:  # the same claim measured by the same cells once, not twice
            continue
        seen.add(key)
        if isinstance(v, NetClaim):
            b, figure = v.badge, v.figure
        else:
            b, figure = badge(v), seed_figure(v.claim)
        hint = v.hint if v.hint.startswith("run") else f"run {v.hint}"
        measured = e(v.measured) if v.measured is not None else f"<i>{e(hint)}</i>"
        out.append(f"<tr><td>{e(v.seed)}</td><td>{e(v.claim)}</td><td class='num'>{e(figure)}</td>"
                   f"<td>{measured}</td><td>{e(tier)}</td><td><span class='badge' style='background:{BADGE[b]}'>"
                   f"{e(b)}</span></td></tr>")
    return ("<table class='claims'><tr><th>seed</th><th>claim</th><th>seed figure</th><th>measured here</th>"
            "<th>tier</th><th>verdict</th></tr>" + "".join(out) + "</table>")


@dataclass
class Point:
    """A chart's bar: the median over rounds and the 95 % interval of :func:`kvmtune.lab.stats.summarize`, the
    figures the tables print for the same cell."""

    value: float
    low: float | None  # None with one round
    high: float | None
    n: int

    def scaled(self, factor: float) -> Point:
        return Point(self.value * factor, None if self.low is None else self.low * factor,
                     None if self.high is None else self.high * factor, self.n)

    def bar(self) -> Bar:
        return Bar(self.value, None, self.n, low=self.low, high=self.high)


def point(values: Sequence[float]) -> Point:
    s = summarize(values)
    return Point(s.median, s.low, s.high, s.n)


def _varying(cells: Sequence[CellRow]) -> list[str]:
    return [d for d in DIMENSIONS if len({str(c.config.get(d, "")) for c in cells}) > 1]


def _label(cell: CellRow, dims: Sequence[str]) -> str:
    return " ".join(str(cell.config.get(d, "–")) for d in dims) or "all"


def grouped_chart(cells: Sequence[CellRow], workload: str, metric: str, unit: str, scale: float,
                  baseline: str | None = None) -> str:
    """Grouped bars: the remaining varying dimensions along x (the first one as the outer group), one colour
    per cache mode (or the last varying dimension), one panel per aio mode; 95 % whiskers when repeated."""
    ok = [c for c in cells if c.status == "ok" and c.workload == workload and metric in c.metrics]
    if not ok:
        return ""
    varying = _varying(ok)
    colour_dim = "cache" if "cache" in varying else (varying[-1] if varying else "")
    panel_dim = "aio" if "aio" in varying and colour_dim != "aio" else ""
    x_dims = [d for d in varying if d not in (colour_dim, panel_dim)]
    outer_dims, inner_dims = (x_dims[:1], x_dims[1:]) if len(x_dims) > 1 else ([], x_dims)
    groups: dict[tuple[XKey, str], list[float]] = {}
    members: dict[tuple[XKey, str], list[CellRow]] = {}
    for c in ok:
        x = (f"{panel_dim}={c.config.get(panel_dim, '–')}" if panel_dim else "", _label(c, outer_dims) if outer_dims else "",
             _label(c, inner_dims))
        groups.setdefault((x, str(c.config.get(colour_dim, "")) or "–"), []).append(c.metrics[metric] / scale)
        members.setdefault((x, str(c.config.get(colour_dim, "")) or "–"), []).append(c)
    points = {k: point(v) for k, v in groups.items()}
    base_value = None
    if baseline:  # the bar whose cells are that configuration (a name kvmtune prints, resolved by the CLI)
        base = [points[k] for k, cs in members.items() if {c.key.split("|")[0] for c in cs} == {baseline}]
        base_value = base[0].value if len(base) == 1 and base[0].value > 0 else None
    about = lookup(metric)
    if base_value:
        points = {k: p.scaled(100 / base_value) for k, p in points.items()}
        y_title = f"% of {baseline}"
    elif about is not None:
        better = {"higher": "higher is better", "lower": "lower is better"}.get(about.better.value, "")
        y_title = f"{about.label}, {unit}" + (f" ({better})" if better else "")
    else:
        y_title = unit
    xs = sorted({k[0] for k in points})
    colours = sorted({k[1] for k in points})
    bars = {k: p.bar() for k, p in points.items()}
    return bar_chart(BarChart(
        label=f"{workload}: {y_title}", y_title=y_title, xs=xs, series=colours, bars=bars,
        series_title=f"{colour_dim or 'configuration'}:", reference=100.0 if base_value else None,
        level_names=("", outer_dims[0] if outer_dims else "", " ".join(inner_dims)),
        footnote=f"x: {' × '.join(x_dims) or '—'}; bars: median over rounds (the tables' figure); whiskers: its 95 % "
                 "interval (Student's t on the logarithms) where repeated"))


def percentile_table(cells: Sequence[CellRow]) -> str:
    """Completion-latency percentiles (µs) per configuration and workload: the median over rounds."""
    rows: dict[tuple[str, str], dict[str, list[float]]] = {}
    for c in cells:
        if c.status != "ok":
            continue
        have = {p: c.metrics[p] for p in PERCENTILES if p in c.metrics and c.metrics[p] > 0}
        if have:
            slot = rows.setdefault((c.key.split("|")[0], c.workload), {})
            for p, v in have.items():
                slot.setdefault(p, []).append(v)
    if not rows:
        return ""
    head = "".join(f"<th>{p.removeprefix('clat_').removesuffix('_us')} µs</th>" for p in PERCENTILES)
    body = "".join(
        f"<tr><td>{e(cfg)}</td><td>{e(w)}</td>"
        + "".join(f"<td class='num'>{median(vals[p]):,.0f}</td>" if p in vals else "<td class='num'>–</td>"
                  for p in PERCENTILES) + "</tr>"
        for (cfg, w), vals in sorted(rows.items()))
    return f"<table><tr><th>configuration</th><th>workload</th>{head}</tr>{body}</table>"


def verified_table(cells: Sequence[CellRow]) -> str:
    """``kvmtune verify`` results: one row per finding, the ratio B/A with its 95 % interval and a badge."""
    rows = []
    for c in cells:
        cfg, m = c.config, c.metrics
        head = (f"<td>{e(str(cfg.get('rule', '')))}</td><td>{e(str(cfg.get('target', '')))}</td>"
                f"<td>{e(str(cfg.get('change', '')))}</td>")
        if c.status != "ok" or "before" not in m:
            rows.append(f"<tr>{head}<td colspan='4'><i>not measured: {e(c.error or c.status)}</i></td>"
                        f"<td><span class='badge' style='background:{BADGE[NOT_MEASURED]}'>{NOT_MEASURED}</span></td></tr>")
            continue
        unit = str(cfg.get("unit") or "")
        ci = (f" [{m['ratio_ci_low']:.2f}, {m['ratio_ci_high']:.2f}]" if "ratio_ci_low" in m else " (no interval)")
        verdict = str(cfg.get("verdict", ""))
        verdict = verdict if verdict in BADGE else INCONCLUSIVE
        colour = BADGE[verdict]
        rows.append(
            f"<tr>{head}<td class='num'>{m['before']:,.4g} → {m['after']:,.4g} {e(unit)}</td>"
            f"<td class='num'>{m.get('ratio', 0):.2f}{ci}</td><td>{e(seed_figure(str(cfg.get('seed', ''))))}</td>"
            f"<td>{e(str(cfg.get('tier', '')))}</td><td><span class='badge' style='background:{colour}'>{e(verdict)}"
            f"</span></td></tr>")
    return ("<table class='claims'><tr><th>rule</th><th>target</th><th>change</th><th>before → after</th>"
            "<th>ratio B/A [95 %]</th><th>seed figure</th><th>tier</th><th>verdict</th></tr>" + "".join(rows) + "</table>")


def ratio_chart(cells: Sequence[CellRow]) -> str:
    """Each verified fix's ratio (after/before, higher = the fix helps) with its 95 % interval on a log
    axis around 1, the way the seeds' "run B vs run A" charts read."""
    pts = [(f"{c.config.get('rule')} {c.config.get('target')}", c.metrics) for c in cells
           if c.status == "ok" and c.metrics.get("ratio", 0) > 0]
    if not pts:
        return ""
    lo = min(min(m.get("ratio_ci_low", m["ratio"]), m["ratio"]) for _, m in pts)
    hi = max(max(m.get("ratio_ci_high", m["ratio"]), m["ratio"]) for _, m in pts)
    lo, hi = min(lo, 0.5), max(hi, 2.0)
    lo, hi = max(lo, 1e-3), min(hi, 1e3)
    left, width, row = 260, 520, 26
    height = 40 + row * len(pts)

    def x_of(v: float) -> float:
        v = min(max(v, lo), hi)
        return left + width * (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))

    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 40}" height="{height}" '
           f'font-family="sans-serif" font-size="10" role="img" aria-label="verified fixes: ratio after/before">']
    for tick in (0.01, 0.1, 0.5, 1, 2, 10, 100):
        if lo <= tick <= hi:
            x = x_of(tick)
            svg.append(f'<line x1="{x:.1f}" y1="14" x2="{x:.1f}" y2="{height - 14}" stroke="{"#333" if tick == 1 else "#ddd"}"/>'
                       f'<text x="{x:.1f}" y="{height - 2}" text-anchor="middle">{tick:g}×</text>')
    for i, (label, m) in enumerate(pts):
        y = 26 + i * row
        svg.append(f'<text x="{left - 8}" y="{y + 3}" text-anchor="end">{e(label[:42])}</text>')
        if "ratio_ci_low" in m:
            svg.append(f'<line x1="{x_of(m["ratio_ci_low"]):.1f}" y1="{y}" x2="{x_of(m["ratio_ci_high"]):.1f}" '
                       f'y2="{y}" stroke="#4477aa" stroke-width="2"/>')
        svg.append(f'<circle cx="{x_of(m["ratio"]):.1f}" cy="{y}" r="4" fill="#4477aa">'
                   f'<title>{e(label)}: {m["ratio"]:.2f}×</title></circle>')
    svg.append(f'<text x="{left}" y="10">after / before (log scale; right of 1× = the fix helps on this metric)</text>')
    svg.append("</svg>")
    return "".join(svg)
