"""Pieces of the HTML report that a performance engineer reads first: the summary with a table of seed
claims and verdict badges, grouped bar charts that follow the experiment's dimensions (inline SVG:
self-contained, crisp in print), a chosen baseline, 95 % intervals, and latency percentiles."""

from __future__ import annotations

import html
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from kvmtune.bench.metrics import lookup
from kvmtune.bench.stats import mean, stdev, t95
from kvmtune.bench.store import CellRow
from kvmtune.bench.verdicts import Verdict

# the dimensions a storage cell varies along, in the order a chart uses them
DIMENSIONS = ("bus", "fmt", "prealloc", "cache", "aio", "target", "sched", "host_fs")
PALETTE = ("#4477aa", "#ee6677", "#228833", "#ccbb44", "#66ccee", "#aa3377", "#bbbbbb", "#000000")
# (stored metric, unit shown, divisor): the label and direction come from the metrics catalogue
CHART_METRICS = (("iops", "IOPS", 1.0), ("bw_Bps", "MB/s", 1e6), ("lat_mean_us", "µs", 1.0))
PERCENTILES = ("clat_p50_us", "clat_p90_us", "clat_p99_us", "clat_p99.9_us")
BADGE = {"holds": "#2b8a3e", "partly": "#e67700", "does not hold": "#c92a2a", "inconclusive": "#868e96",
         "not measured": "#adb5bd", "measured": "#1971c2"}

e = html.escape


def seed_figure(claim: str) -> str:
    """The number a seed claim states (``5×``, ``70 %``), or '–'."""
    m = re.search(r"(\d+(?:\.\d+)?)\s*(×|x\b| ?%)", claim)
    return f"{m.group(1)}{'×' if m.group(2) in ('×', 'x') else ' %'}" if m else "–"


def badge(v: Verdict) -> str:
    """holds / partly / does not hold / inconclusive / not measured, from what the verdict says and its ratio."""
    if v.measured is None:
        return "not measured"
    text = v.measured.lower()
    for word in ("does not hold", "inconclusive", "holds"):
        if word in text:
            return word
    claimed = re.search(r"(\d+(?:\.\d+)?)\s*×", v.claim)
    if v.ratio is not None and claimed:
        target = float(claimed.group(1))
        if v.ratio >= 0.8 * target:
            return "holds"
        return "partly" if v.ratio > 1.05 else "does not hold"
    return "measured"


def claims_table(rows: Sequence[tuple[str, Verdict]]) -> str:
    """One row per seed claim and tier: claim | seed figure | measured here | verdict."""
    seen: set[tuple[str, str, str, str | None]] = set()
    out = []
    for tier, v in rows:
        key = (tier, v.seed, v.claim, v.measured)
        if key in seen:  # the same claim measured by the same cells once, not twice
            continue
        seen.add(key)
        b = badge(v)
        hint = v.hint if v.hint.startswith("run") else f"run {v.hint}"
        measured = e(v.measured) if v.measured is not None else f"<i>{e(hint)}</i>"
        out.append(f"<tr><td>{e(v.seed)}</td><td>{e(v.claim)}</td><td class='num'>{e(seed_figure(v.claim))}</td>"
                   f"<td>{measured}</td><td>{e(tier)}</td><td><span class='badge' style='background:{BADGE[b]}'>"
                   f"{e(b)}</span></td></tr>")
    return ("<table class='claims'><tr><th>seed</th><th>claim</th><th>seed figure</th><th>measured here</th>"
            "<th>tier</th><th>verdict</th></tr>" + "".join(out) + "</table>")


@dataclass
class Point:
    value: float
    half_width: float | None  # 95 % interval half-width; None with one round
    n: int


def _point(values: Sequence[float]) -> Point:
    m = mean(values)
    if len(values) < 2:
        return Point(m, None, len(values))
    return Point(m, t95(len(values) - 1) * stdev(values) / math.sqrt(len(values)), len(values))


def _varying(cells: Sequence[CellRow]) -> list[str]:
    return [d for d in DIMENSIONS if len({str(c.config.get(d, "")) for c in cells}) > 1]


def _label(cell: CellRow, dims: Sequence[str]) -> str:
    return " ".join(str(cell.config.get(d, "–")) for d in dims) or "all"


def grouped_chart(cells: Sequence[CellRow], workload: str, metric: str, unit: str, scale: float,
                  baseline: str | None = None) -> str:
    """Grouped bars: the remaining varying dimensions along x, one colour per cache mode (or the last
    varying dimension), one panel per aio mode; 95 % interval error bars when repeated."""
    ok = [c for c in cells if c.status == "ok" and c.workload == workload and metric in c.metrics]
    if not ok:
        return ""
    varying = _varying(ok)
    colour_dim = "cache" if "cache" in varying else (varying[-1] if varying else "")
    panel_dim = "aio" if "aio" in varying and colour_dim != "aio" else ""
    x_dims = [d for d in varying if d not in (colour_dim, panel_dim)]
    groups: dict[tuple[str, str, str], list[float]] = {}
    for c in ok:
        key = (_label(c, [panel_dim]) if panel_dim else "", _label(c, x_dims), str(c.config.get(colour_dim, "")))
        groups.setdefault(key, []).append(c.metrics[metric] / scale)
    points = {k: _point(v) for k, v in groups.items()}
    base_value = None
    if baseline:
        base = [p.value for (_, x, col), p in points.items() if baseline in (x, col, f"{x} {col}".strip())]
        base_value = base[0] if base else None
    if base_value:
        points = {k: Point(100 * p.value / base_value, None if p.half_width is None else 100 * p.half_width / base_value,
                           p.n) for k, p in points.items()}
        unit = f"% of {baseline}"
    values = [p.value for p in points.values() if p.value > 0]
    log = bool(values) and max(values) / min(values) > 20
    panels = sorted({k[0] for k in points})
    xs = sorted({k[1] for k in points})
    colours = sorted({k[2] for k in points})
    top = max((p.value + (p.half_width or 0) for p in points.values()), default=1.0) or 1.0
    bottom = min(values) / 2 if log else 0.0
    bar_w, plot_h, left, pad = 20, 200, 64, 18
    group_w = max(bar_w * len(colours) + pad, 96)  # room for an x label such as "qcow2 metadata"
    panel_w = max(240, group_w * len(xs) + pad)
    width = max(left + panel_w * len(panels) + 10, left + 80 + len(colours) * 110, 560)
    height = plot_h + 110

    def y_of(v: float) -> float:
        if log:
            v = max(v, bottom)
            return 20 + plot_h * (1 - (math.log10(v) - math.log10(bottom)) / (math.log10(top) - math.log10(bottom)))
        return 20 + plot_h * (1 - v / top)

    about = lookup(metric)
    if about is not None and not base_value:
        better = {"higher": "higher is better", "lower": "lower is better"}.get(about.better.value, "")
        unit = f"{about.label}, {unit}" + (f" ({better})" if better else "")
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="10" role="img" aria-label="{e(workload)} {e(unit)}">']
    for frac in (0, 0.25, 0.5, 0.75, 1.0):
        v = bottom * (top / bottom) ** frac if log else top * frac
        y = y_of(v)
        svg.append(f'<line x1="{left - 4}" y1="{y:.1f}" x2="{width - 10}" y2="{y:.1f}" stroke="#ddd"/>'
                   f'<text x="{left - 6}" y="{y + 3:.1f}" text-anchor="end">{_tick(v)}</text>')
    svg.append(f'<text x="12" y="{20 + plot_h / 2}" transform="rotate(-90 12 {20 + plot_h / 2})" '
               f'text-anchor="middle">{e(unit)}{" (log scale)" if log else ""}</text>')
    for pi, panel in enumerate(panels):
        x0 = left + pi * panel_w
        if panel:
            svg.append(f'<text x="{x0 + panel_w / 2}" y="12" text-anchor="middle" font-weight="bold">'
                       f'{e(panel_dim)}={e(panel)}</text>')
        for xi, xlab in enumerate(xs):
            gx = x0 + pad + xi * group_w
            for ci, col in enumerate(colours):
                p = points.get((panel, xlab, col))
                if p is None:
                    continue
                bx = gx + ci * bar_w
                y = y_of(p.value)
                svg.append(f'<rect x="{bx}" y="{y:.1f}" width="{bar_w - 2}" height="{20 + plot_h - y:.1f}" '
                           f'fill="{PALETTE[ci % len(PALETTE)]}"><title>{e(xlab)} {e(col)}: {p.value:,.4g} {e(unit)}'
                           f' (n={p.n})</title></rect>')
                if p.half_width:
                    y1, y2 = y_of(p.value - p.half_width), y_of(p.value + p.half_width)
                    cx = bx + (bar_w - 2) / 2
                    svg.append(f'<path d="M{cx:.1f} {y1:.1f}V{y2:.1f}M{cx - 3:.1f} {y1:.1f}h6M{cx - 3:.1f} {y2:.1f}h6" '
                               f'stroke="#222" fill="none"/>')
            svg.append(f'<text x="{gx + group_w / 2 - pad / 2:.1f}" y="{20 + plot_h + 14}" text-anchor="middle">'
                       f'{e(xlab)}</text>')
    ly = plot_h + 56
    svg.append(f'<text x="{left}" y="{ly}">{e(colour_dim or "configuration")}:</text>')
    for ci, col in enumerate(colours):
        lx = left + 60 + ci * 110
        svg.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{PALETTE[ci % len(PALETTE)]}"/>'
                   f'<text x="{lx + 14}" y="{ly}">{e(col or "–")}</text>')
    svg.append(f'<text x="{left}" y="{ly + 18}" fill="#555">x: {e(" ".join(x_dims) or "—")}; bars: mean; '
               f'whiskers: 95 % interval where repeated</text>')
    svg.append("</svg>")
    return "".join(svg)


def _tick(v: float) -> str:
    """An axis value people read at a glance: 12,345 rather than 1.23e+04."""
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def percentile_table(cells: Sequence[CellRow]) -> str:
    """Completion-latency percentiles (µs) per configuration and workload, averaged over rounds."""
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
        + "".join(f"<td class='num'>{mean(vals[p]):,.0f}</td>" if p in vals else "<td class='num'>–</td>"
                  for p in PERCENTILES) + "</tr>"
        for (cfg, w), vals in sorted(rows.items()))
    return f"<table><tr><th>configuration</th><th>workload</th>{head}</tr>{body}</table>"


VERDICT_BADGE = {"helps": "#2b8a3e", "hurts": "#c92a2a", "no measurable effect": "#868e96"}


def verified_table(cells: Sequence[CellRow]) -> str:
    """``kvmtune verify`` results: one row per finding, the ratio B/A with its 95 % interval and a badge."""
    rows = []
    for c in cells:
        cfg, m = c.config, c.metrics
        head = (f"<td>{e(str(cfg.get('rule', '')))}</td><td>{e(str(cfg.get('target', '')))}</td>"
                f"<td>{e(str(cfg.get('change', '')))}</td>")
        if c.status != "ok" or "before" not in m:
            rows.append(f"<tr>{head}<td colspan='4'><i>not measured: {e(c.error or c.status)}</i></td>"
                        f"<td><span class='badge' style='background:{BADGE['not measured']}'>not measured</span></td></tr>")
            continue
        unit = str(cfg.get("unit") or "")
        ci = (f" [{m['ratio_ci_low']:.2f}, {m['ratio_ci_high']:.2f}]" if "ratio_ci_low" in m else " (no interval)")
        verdict = str(cfg.get("verdict", ""))
        colour = VERDICT_BADGE.get(verdict, BADGE["measured"])
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
