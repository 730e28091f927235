"""``kvmtune canary history --format html``: one self-contained page, a chart per metric (bench/svgchart's bars).

Each run is a bar at its median, coloured by its recorded verdict (baseline, no-regression, regression, …; a labelled
metric's figures by label as well: a TCG boot is never drawn as the same series as a KVM one). The x axis is time:
the runs in order, grouped by day, in panels between baseline resets. The line is the current baseline (the median of
the baseline runs since the last reset). A run whose environment changed since the run before is marked ``▲N`` under
its bar, and note N under the chart names the changes (package versions, kernel, limits …)."""

from __future__ import annotations

import html
from typing import Any

from kvmtune.bench.svgchart import Bar, BarChart, XKey, bar_chart
from kvmtune.canary.judge import label_text
from kvmtune.canary.metrics import METRICS
from kvmtune.textsafe import safe

VERDICT_ORDER = ("baseline", "no-regression", "regression", "not-judged", "complete", "errors")


def _e(text: str) -> str:
    return html.escape(safe(text))


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def metric_chart(rows: list[dict[str, Any]], name: str) -> str:
    """The chart of one metric over ``rows`` (:func:`kvmtune.canary.history.history`); "" when no run measured it."""
    metric = next(m for m in METRICS if m.name == name)
    xs: list[XKey] = []
    bars: dict[tuple[XKey, str], Bar] = {}
    series: list[str] = []
    notes: list[str] = []
    panel = "first baseline"
    baseline_now: list[float] = []
    for row in rows:
        if "reset" in row:
            panel = f"after reset {row['run']}"  # its date and reason are listed above the charts
            baseline_now = []
            continue
        value = row["metrics"].get(name)
        if value is None:
            continue
        day, _, _clock = row["started"].partition(" ")
        inner = f"run {row['run']}"
        if row["changed"]:
            notes.append(f"▲{len(notes) + 1} run {row['run']}: " + "; ".join(
                f"{c['what']} {c['before']} → {c['after']}" for c in row["changed"]))
            inner += f" ▲{len(notes)}"
        verdict = row["verdict"] or row["status"]
        labels = row.get("labels", {}).get(name)
        serie = verdict + (f" ({label_text(labels)})" if labels else "")
        if serie not in series:
            series.append(serie)
        x = (panel, day, inner)
        xs.append(x)
        bars[(x, serie)] = Bar(float(value), n=1, note=f"run {row['run']} {row['started']}: {verdict}")
        if verdict == "baseline":
            baseline_now.append(float(value))
    if not bars:
        return ""
    series.sort(key=lambda s: (next((i for i, v in enumerate(VERDICT_ORDER) if s.startswith(v)), 99), s))
    direction = "higher is better" if metric.higher_is_better else "lower is better"
    chart = BarChart(
        label=f"{name}: each canary run's median",
        y_title=f"{name}, {metric.unit} ({direction})",
        xs=xs, series=series, bars=bars, series_title="verdict",
        reference=_median(baseline_now) if baseline_now else None,
        footnote=" ".join(notes + (["Line: the median of the current baseline's runs."] if baseline_now else [])),
        level_names=("", "day", "run"),
    )
    return bar_chart(chart)


def render_html(rows: list[dict[str, Any]]) -> str:
    charts = []
    for m in METRICS:
        svg = metric_chart(rows, m.name)
        if svg:
            charts.append(f"<h2>{_e(m.name)}</h2><p>{_e(m.what)}</p>{svg}")
    resets = "".join(f"<li>run {row['run']} ({_e(row['started'])}): baseline reset: {_e(row['reset'])}</li>"
                     for row in rows if "reset" in row)
    runs = sum(1 for row in rows if "reset" not in row)
    body = "".join(charts) if charts else "<p>no canary runs yet ('kvmtune canary run' makes one)</p>"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>kvmtune canary history</title>"
            "<style>body{font-family:sans-serif;max-width:1200px;margin:1em auto;padding:0 1em}"
            "h2{font-size:1.1em;margin-top:1.5em}p{color:#444}</style></head><body>"
            f"<h1>kvmtune canary history</h1><p>{runs} run(s); each bar is a run's median over its rounds, coloured by "
            "its verdict (docs/canary.md). ▲N marks a run whose environment changed since the run before.</p>"
            + (f"<ul>{resets}</ul>" if resets else "") + body + "</body></html>\n")
