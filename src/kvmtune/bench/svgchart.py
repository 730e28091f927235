"""Grouped bar charts as inline SVG: the one drawing every HTML report uses (storage, network, compare).

Inline SVG keeps a report one self-contained file that prints crisply at any size and needs no
plotting library. The x axis has up to three levels, so a chart follows the experiment's dimensions
instead of listing configurations alphabetically: panels (bold titles on top, e.g. one per aio mode),
outer groups (labelled under a bracket, e.g. a workload) and inner groups (labelled under the bars,
e.g. the user count), with one bar per series (a colour each, in the legend).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvmtune.textsafe import html_safe

# Paul Tol's "bright" scheme: distinguishable for colour-blind readers and in greyscale print
PALETTE = ("#4477aa", "#ee6677", "#228833", "#ccbb44", "#66ccee", "#aa3377", "#bbbbbb", "#222222")
LOG_SPAN = 20.0  # values spanning more than this factor get a log axis
CHAR_W = 5.6  # average width of a 10 px sans-serif character, for laying out labels without a browser

e = html_safe


@dataclass(frozen=True)
class Bar:
    value: float
    half_width: float | None = None  # 95 % interval half-width; None: not repeated, no whisker
    n: int = 1
    note: str = ""  # extra tooltip text
    low: float | None = None  # an interval that is not symmetric (log scale): its ends, instead of half_width
    high: float | None = None

    @property
    def ends(self) -> tuple[float, float] | None:
        """The whisker's ends, or None (one round: no whisker)."""
        if self.low is not None and self.high is not None:
            return self.low, self.high
        if self.half_width:
            return self.value - self.half_width, self.value + self.half_width
        return None


XKey = tuple[str, str, str]  # (panel, outer group, inner group)


@dataclass(frozen=True)
class BarChart:
    label: str  # what the chart shows, for screen readers and the tooltip
    y_title: str  # metric and unit, e.g. "transactions/s (higher is better)"
    xs: Sequence[XKey]  # x positions in drawing order
    series: Sequence[str]
    bars: Mapping[tuple[XKey, str], Bar]
    series_title: str = ""
    colours: Sequence[str] = PALETTE
    log: bool | None = None  # None: a log axis when positive values span more than LOG_SPAN
    reference: float | None = None  # a darker line at this value (100 % of a baseline; 0 is always drawn)
    footnote: str = ""
    max_width: int = 1180
    percent: bool = False  # signed percentages: ticks as +20 %
    level_names: tuple[str, str, str] = ("", "", "")  # what the panel, outer and inner labels are, left of the axis


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (steps of 1, 2, 2.5 or 5 × 10^k)."""
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = mag
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        step = m * mag
        if (hi - lo) / step <= count:
            break
    first = math.floor(lo / step + 1e-9) * step
    ticks = []
    v = first
    while v < hi + step * 0.999:
        ticks.append(round(v, 12))
        v += step
    return ticks


def log_ticks(lo: float, hi: float) -> list[float]:
    """Decades covering [lo, hi], with 2× and 5× between them when there are few decades."""
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    steps = (1.0, 2.0, 5.0) if b - a <= 3 else (1.0,)
    out = [m * 10.0**k for k in range(a, b + 1) for m in steps]
    first = max(t for t in out if t <= lo * (1 + 1e-9))
    last = min(t for t in out if t >= hi * (1 - 1e-9))
    return [t for t in out if first <= t <= last]


def tick_text(v: float, percent: bool = False) -> str:
    """An axis value read at a glance: 12,345 rather than 1.23e+04; percentages signed."""
    if percent:
        return f"{v:+,.0f} %" if v else "0"
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) < 0.001:  # 0.00001, not 1e-05
        return f"{v:.12f}".rstrip("0")
    return f"{v:.3g}"


def wrap(text: str, width: int) -> list[str]:
    """Lines of at most ``width`` characters, broken at spaces (SVG text does not wrap by itself)."""
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def bar_chart(chart: BarChart) -> str:
    """The chart as one ``<svg>`` element (width/height set, viewBox so it scales down in print)."""
    xs = list(chart.xs)
    present = [(x, s) for x in xs for s in chart.series if (x, s) in chart.bars]
    if not present:
        return ""
    series = [s for s in chart.series if any((x, s) in chart.bars for x in xs)]
    xs = [x for x in xs if any((x, s) in chart.bars for s in series)]
    values = [b.value for b in chart.bars.values()]
    signed = min(values) < 0
    # a whisker of a positive quantity may reach below zero (two rounds, t = 12.7): the axis does not follow it
    lows = [min(b.value, (b.ends or (b.value, b.value))[0]) for b in chart.bars.values()]
    lows = lows if signed else [max(0.0, v) for v in lows]
    highs = [max(b.value, (b.ends or (b.value, b.value))[1]) for b in chart.bars.values()]
    positives = [v for v in values if v > 0]
    log = chart.log if chart.log is not None else (
        not signed and len(positives) == len(values) and max(positives) / min(positives) > LOG_SPAN)
    if log:
        ticks = log_ticks(min(positives + [v for v in lows if v > 0]), max(highs))
    else:
        ticks = nice_ticks(min(0.0, min(lows)), max(0.0, max(highs)))
    y_lo, y_hi = ticks[0], ticks[-1]

    # layout: units of one bar width; a gap of 0.8 bar between inner groups, 1.6 between outer groups,
    # 2.4 between panels
    n_s = len(series)
    units = 0.0
    prev: XKey | None = None
    offsets: list[float] = []
    for x in xs:
        if prev is not None:
            units += 2.4 if x[0] != prev[0] else 1.6 if x[1] != prev[1] else 0.8
        offsets.append(units)
        units += n_s
        prev = x
    left, right, top = 74, 16, 30 if any(x[0] for x in xs) else 14
    plot_h = 230
    bar_w = max(3.0, min(30.0, (chart.max_width - left - right - 8) / (units + 0.8)))
    # few bars: the groups spread over a readable width, the bars of a group stay side by side
    slot = max(bar_w, (600 - left - right) / (units + 0.8))
    plot_w = slot * (units + 0.8)
    group_w = slot * n_s
    pad = (group_w - n_s * bar_w) / 2
    inner_long = max((len(x[2]) for x in xs), default=0) * CHAR_W
    rotate = inner_long > group_w + 0.8 * slot - 2
    inner_h = (inner_long * 0.6 + 14) if rotate else 14
    has_outer = any(x[1] for x in xs)
    width = int(max(left + plot_w + right, 600))
    lx0 = left + (CHAR_W * len(chart.series_title) + 12 if chart.series_title else 0)
    col_w = max(120.0, min(260.0, max(len(s) for s in series) * CHAR_W + 26))
    cols = max(1, int((width - lx0) // col_w))
    notes = wrap(chart.footnote, int((width - left - 8) / CHAR_W)) if chart.footnote else []
    bottom = inner_h + (22 if has_outer else 4) + 22 + 16 * math.ceil(n_s / cols) + 14 * len(notes)
    height = int(top + plot_h + bottom)
    base_y = top + plot_h

    def y_of(v: float) -> float:
        if log:
            v = max(v, y_lo)
            frac = (math.log10(v) - math.log10(y_lo)) / (math.log10(y_hi) - math.log10(y_lo))
        else:
            frac = (v - y_lo) / (y_hi - y_lo)
        return top + plot_h * (1 - min(max(frac, 0.0), 1.0))

    zero_y = y_of(y_lo if log else 0.0)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
           f'font-family="sans-serif" font-size="10" role="img" aria-label="{e(chart.label)}">',
           f"<title>{e(chart.label)}</title>"]
    x0 = left + 0.4 * slot
    for t in ticks:
        y = y_of(t)
        svg.append(f'<line x1="{left - 4}" y1="{y:.1f}" x2="{left + plot_w:.1f}" y2="{y:.1f}" stroke="#e4e4e4"/>'
                   f'<text x="{left - 6}" y="{y + 3.5:.1f}" text-anchor="end">{e(tick_text(t, chart.percent))}</text>')
    mid = top + plot_h / 2
    svg.append(f'<text x="13" y="{mid:.0f}" transform="rotate(-90 13 {mid:.0f})" text-anchor="middle">'
               f'{e(chart.y_title)}{" — log scale" if log else ""}</text>')
    for i, x in enumerate(xs):
        gx = x0 + offsets[i] * slot
        for si, s in enumerate(series):
            bar = chart.bars.get((x, s))
            if bar is None:
                continue
            bx = gx + pad + si * bar_w
            y = y_of(bar.value)
            y_top, h = min(y, zero_y), abs(zero_y - y)
            colour = chart.colours[si % len(chart.colours)]
            what = " / ".join(p for p in x if p)
            if bar.low is not None and bar.high is not None:
                ci = f" [{bar.low:,.4g} – {bar.high:,.4g}] (95 %, n={bar.n})"
            else:
                ci = f" ± {bar.half_width:,.4g} (95 %, n={bar.n})" if bar.half_width else f" (n={bar.n})"
            svg.append(f'<rect x="{bx:.1f}" y="{y_top:.1f}" width="{max(bar_w - 1.5, 1.5):.1f}" height="{max(h, 0.5):.1f}" '
                       f'fill="{colour}"><title>{e(what)} — {e(s)}: {bar.value:,.4g}{e(ci)}{e(bar.note)}</title></rect>')
            if chart.percent and bar_w >= 18:  # few bars of signed %: the figure itself, at the bar's end
                ty = y - 3 if bar.value >= 0 else y + 10
                svg.append(f'<text x="{bx + (bar_w - 1.5) / 2:.1f}" y="{ty:.1f}" text-anchor="middle" font-size="8">'
                           f'{bar.value:+.0f}</text>')
            if bar.ends is not None:
                cx = bx + (bar_w - 1.5) / 2
                y1 = min(y_of(bar.ends[0]), base_y)
                y2 = max(y_of(bar.ends[1]), top)
                cap = min(3.0, bar_w / 3)
                svg.append(f'<path d="M{cx:.1f} {y1:.1f}V{y2:.1f}M{cx - cap:.1f} {y1:.1f}h{2 * cap:.1f}'
                           f'M{cx - cap:.1f} {y2:.1f}h{2 * cap:.1f}" stroke="#222" stroke-width="1" fill="none"/>')
        label_x = gx + group_w / 2
        if rotate:
            svg.append(f'<text x="{label_x:.1f}" y="{base_y + 10}" text-anchor="end" '
                       f'transform="rotate(-35 {label_x:.1f} {base_y + 10})">{e(x[2])}</text>')
        else:
            svg.append(f'<text x="{label_x:.1f}" y="{base_y + 12}" text-anchor="middle">{e(x[2])}</text>')
    # outer groups: a bracket under their inner labels; panels: a bold title over their bars
    for level, y_text in ((1, base_y + inner_h + 16), (0, top - 10)):
        i = 0
        while i < len(xs):
            j = i
            while j + 1 < len(xs) and xs[j + 1][: level + 1] == xs[i][: level + 1]:
                j += 1
            name = xs[i][level]
            if name:
                a = x0 + offsets[i] * slot + pad
                b = x0 + (offsets[j] + n_s) * slot - pad
                if level == 1:
                    yb = base_y + inner_h + 3
                    svg.append(f'<path d="M{a:.1f} {yb - 3:.1f}V{yb:.1f}H{b - 1.5:.1f}V{yb - 3:.1f}" stroke="#888" fill="none"/>')
                    svg.append(f'<text x="{(a + b) / 2:.1f}" y="{y_text:.1f}" text-anchor="middle">{e(name)}</text>')
                else:
                    svg.append(f'<text x="{(a + b) / 2:.1f}" y="{y_text:.1f}" text-anchor="middle" '
                               f'font-weight="bold">{e(name)}</text>')
                    if i > 0:
                        sep = a - pad - 1.2 * slot
                        svg.append(f'<line x1="{sep:.1f}" y1="{top}" x2="{sep:.1f}" y2="{base_y}" stroke="#bbb" '
                                   f'stroke-dasharray="3 3"/>')
            i = j + 1
    for name, y_name in ((chart.level_names[2], base_y + 12), (chart.level_names[1] if has_outer else "", base_y + inner_h + 16)):
        if name:
            svg.append(f'<text x="{left - 6}" y="{y_name:.1f}" text-anchor="end" fill="#555" font-style="italic">'
                       f'{e(name)}</text>')
    svg.append(f'<line x1="{left}" y1="{zero_y:.1f}" x2="{left + plot_w:.1f}" y2="{zero_y:.1f}" stroke="#444"/>')
    svg.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{base_y}" stroke="#444"/>')
    if chart.reference is not None and y_lo <= chart.reference <= y_hi:
        ry = y_of(chart.reference)
        svg.append(f'<line x1="{left}" y1="{ry:.1f}" x2="{left + plot_w:.1f}" y2="{ry:.1f}" stroke="#444" '
                   f'stroke-dasharray="6 3"/>')
    ly = base_y + inner_h + (22 if has_outer else 4) + 18
    if chart.series_title:
        svg.append(f'<text x="{left}" y="{ly}" font-weight="bold">{e(chart.series_title)}</text>')
    for si, s in enumerate(series):
        lx = lx0 + (si % cols) * col_w
        yy = ly + 16 * (si // cols)
        svg.append(f'<rect x="{lx:.1f}" y="{yy - 9}" width="11" height="11" fill="{chart.colours[si % len(chart.colours)]}"/>'
                   f'<text x="{lx + 15:.1f}" y="{yy}">{e(s)}</text>')
    for k, note in enumerate(notes):
        svg.append(f'<text x="{left}" y="{ly + 16 * math.ceil(n_s / cols) + 2 + 14 * k}" fill="#555">{e(note)}</text>')
    svg.append("</svg>")
    return "".join(svg)
