"""Seed 002's comparison: run B against run A, test by test.

Seed 002 (seed:002, figures 10-18) draws one group of bars per test, 20 on
the x axis, four bars each — throughput, transaction time, client CPU
efficiency, server CPU efficiency — as the % difference of B against A with
positive meaning B is better. The two runs normally differ in configuration
(bridge vs OVS, MTU 1500 vs 9000), so tests are matched by name, not by the
store's configuration key. A run with several pairs is summed over pairs for
throughput and averaged for the per-transaction and per-MB figures.

For a higher-is-better metric the difference is ``B/A - 1``; for transaction
time and CPU per MB it is ``A/B - 1``, i.e. computed on the rate (transactions
per second of latency budget, MB per CPU second), which is how the seed
speaks of "CPU efficiency".
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvmtune.bench.metrics import lookup
from kvmtune.bench.metrics import metric as catalogue_metric
from kvmtune.bench.net.catalog import SEED_USERS, SEED_WORKLOADS
from kvmtune.bench.store import CellRow, RunRow, Store

# (label, metric): seed 002's four bars; direction comes from the metrics catalogue
BARS = (
    ("throughput", "throughput_Bps"),
    ("transaction time", "lat_avg_us"),
    ("client CPU efficiency", "client_cpu_s_per_mb"),
    ("server CPU efficiency", "server_cpu_s_per_mb"),
)
COLORS = ("#4477aa", "#ee6677", "#228833", "#ccbb44")


def _summed(name: str) -> bool:
    entry = lookup(name)
    return entry is not None and entry.summed_over_pairs


def aggregate(cells: Sequence[CellRow]) -> dict[str, dict[str, float]]:
    """Per test: within a run, pairs summed (throughput, tx/s) or averaged (the rest); then the mean over runs."""
    per_run: dict[tuple[int, str], dict[str, list[float]]] = {}
    for c in cells:
        if c.status != "ok":
            continue
        for name, value in c.metrics.items():
            per_run.setdefault((c.run_id, c.workload), {}).setdefault(name, []).append(value)
    acc: dict[str, dict[str, list[float]]] = {}
    for (_run, test), metrics in per_run.items():
        for n, v in metrics.items():
            acc.setdefault(test, {}).setdefault(n, []).append(sum(v) if _summed(n) else sum(v) / len(v))
    return {test: {n: sum(v) / len(v) for n, v in metrics.items()} for test, metrics in acc.items()}


def _order(test: str) -> tuple[int, int, str]:
    base, _, users = test.partition("--")
    w = SEED_WORKLOADS.index(base) if base in SEED_WORKLOADS else len(SEED_WORKLOADS)
    u = int(users) if users.isdigit() else 0
    return (w, SEED_USERS.index(u) if u in SEED_USERS else u, test)


@dataclass(frozen=True)
class Row:
    test: str
    a: dict[str, float]
    b: dict[str, float]
    pct: dict[str, float | None]  # per BARS label: + means B better


def pct_better(a: float | None, b: float | None, name: str) -> float | None:
    """B against A in %, positive = B better, in the catalogue's direction of ``name``."""
    return catalogue_metric(name).pct_better(a, b)


def seed002_rows(cells_a: Sequence[CellRow], cells_b: Sequence[CellRow]) -> list[Row]:
    ga, gb = aggregate(cells_a), aggregate(cells_b)
    rows = []
    for test in sorted(set(ga) & set(gb), key=_order):
        pct = {label: pct_better(ga[test].get(m), gb[test].get(m), m) for label, m in BARS}
        rows.append(Row(test, ga[test], gb[test], pct))
    return rows


def _describe(run: RunRow) -> str:
    a = run.args
    bits = [str(a.get("topology", run.kind)), f"MTU {a.get('mtu', '?')}", f"{a.get('hosts', '?')} host(s)",
            f"{a.get('pairs', '?')} pair(s)"]  # fmt: skip
    if a.get("tune"):
        bits.append(str(a["tune"]))
    return f"run {run.id}: " + ", ".join(bits) + f" [{run.accel}]"


def text_table(rows: Sequence[Row]) -> str:
    head = f"{'test':24}" + "".join(f"{label:>24}" for label, _ in BARS)
    lines = [head]
    for r in rows:
        cells = "".join(f"{'n/a' if r.pct[label] is None else f'{r.pct[label]:+.1f}%':>24}" for label, _ in BARS)
        lines.append(f"{r.test:24}{cells}")
    return "\n".join(lines)


def chart_png(rows: Sequence[Row], title: str) -> str:
    from kvmtune.bench.report import _plt, _png

    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(8.0, 0.62 * len(rows) + 2), 4.2))
    width = 0.2
    for i, (label, _m) in enumerate(BARS):
        xs = [j + (i - 1.5) * width for j in range(len(rows))]
        ys = [r.pct[label] or 0.0 for r in rows]
        ax.bar(xs, ys, width, label=label, color=COLORS[i])
    ax.axhline(0, color="#333", linewidth=0.8)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r.test.replace("--", "-\u200b-") for r in rows], rotation=60, ha="right", fontsize=7)  # no en dash
    ax.set_ylabel("% difference, positive = B better")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.32))
    return str(_png(fig))


def _fmt(v: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "" if v is None else f"{v / scale:,.{digits}f}"


def seed002_html(run_a: RunRow, run_b: RunRow, rows: Sequence[Row]) -> str:
    from kvmtune.bench.report import CSS

    title = f"B = {_describe(run_b)} against A = {_describe(run_a)}"
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>kvmtune compare {run_a.id} {run_b.id}</title>"
             f"<style>{CSS}</style></head><body>",
             f"<h1>Network: run {run_b.id} against run {run_a.id}</h1>",
             f"<p>{html.escape(title)}<br>generated {time.strftime('%Y-%m-%d %H:%M:%S')}</p>"]  # fmt: skip
    if run_a.accel == "tcg" or run_b.accel == "tcg":
        parts.append("<p class='warn'>Measured under TCG (software emulation): the guests' CPU cost dominates; the "
                     "differences show how the host-side path behaves under emulation, not what KVM guests get.</p>")  # fmt: skip
    if rows:
        png = chart_png(rows, title)
        parts.append(f"<img alt='seed 002 style comparison' src='data:image/png;base64,{png}'>")
    head = ["test"] + [f"{label} %" for label, _ in BARS] + [
        "A MB/s", "B MB/s", "A tx/s", "B tx/s", "A avg µs", "B avg µs", "A p99 µs", "B p99 µs",
        "A client CPU s/MB", "B client CPU s/MB", "A server CPU s/MB", "B server CPU s/MB",
    ]  # fmt: skip
    parts.append("<h2>The numbers behind it</h2><table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>")
    for r in rows:
        vals: list[Any] = [r.test] + [_fmt(r.pct[label]) for label, _ in BARS]
        for metric, scale, digits in (("throughput_Bps", 1e6, 2), ("tps", 1, 0), ("lat_avg_us", 1, 0), ("lat_p99_us", 1, 0),
                                      ("client_cpu_s_per_mb", 1, 4), ("server_cpu_s_per_mb", 1, 4)):  # fmt: skip
            vals += [_fmt(r.a.get(metric), scale, digits), _fmt(r.b.get(metric), scale, digits)]
        parts.append("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in vals) + "</tr>")
    parts.append("</table></body></html>")
    return "\n".join(parts)


def compare_net(store: Store, run_a: RunRow, run_b: RunRow) -> tuple[list[Row], str]:
    """Rows and the text table for two network runs."""
    rows = seed002_rows(store.cells(run_a.id), store.cells(run_b.id))
    return rows, text_table(rows)


# --------------------------------------------------------------------------- seed 002's summary table

CATEGORIES = (
    ("small transactions", ("rr1c-1x1", "rr1c-200x1000"), "tps"),
    ("large transactions", ("rr1c-1000x30k",), "tps"),
    ("streaming", ("str-readx30k", "str-writex30k"), "throughput_Bps"),
)


def _label(config: dict[str, Any]) -> str:
    tune = config.get("tunings") or {}
    return str(config.get("topology", "?")) + (" " + ",".join(f"{k}={v}" for k, v in tune.items()) if tune else "")


def winners(cells: Sequence[CellRow]) -> list[str]:
    """Seed 002's final table from stored network cells (one accelerator): per MTU, host count and pairs,
    which topology moved the most small transactions, large transactions and streaming data.

    Scores are geometric means over the tests every compared topology ran (transactions/s for the
    request/response workloads, bytes/s for streaming), pairs summed.
    """
    groups: dict[tuple[int, int, int], dict[str, list[CellRow]]] = {}
    for c in cells:
        if c.status != "ok" or "topology" not in c.config:
            continue
        g = (int(c.config.get("mtu", 0)), int(c.config.get("hosts", 0)), int(c.config.get("pairs", 0)))
        groups.setdefault(g, {}).setdefault(_label(c.config), []).append(c)
    out = []
    for (mtu, hosts, pairs), by_topo in sorted(groups.items()):
        agg = {topo: aggregate(cs) for topo, cs in by_topo.items()}
        parts = []
        for name, workloads, metric in CATEGORIES:
            tests = [t for t in set.intersection(*(set(a) for a in agg.values())) if t.partition("--")[0] in workloads]
            scores = {}
            for topo, a in agg.items():
                vals = [a[t].get(metric, 0.0) for t in tests]
                if vals and all(v > 0 for v in vals):
                    scores[topo] = math.exp(sum(math.log(v) for v in vals) / len(vals))
            if not scores:
                parts.append(f"{name}: {'no test in common' if len(agg) > 1 else 'not measured'}")
                continue
            ranked = sorted(scores.items(), key=lambda kv: -kv[1])
            if len(ranked) == 1:
                parts.append(f"{name}: only {ranked[0][0]} measured")
            else:
                (best, s1), (second, s2) = ranked[0], ranked[1]
                n = f"{len(tests)} test{'s' if len(tests) > 1 else ''}"
                parts.append(f"{name}: {best} (+{100 * (s1 / s2 - 1):.0f}% over {second}, {n})")
        out.append(f"MTU {mtu}, {hosts} host{'s' if hosts > 1 else ''}, {pairs} pair{'s' if pairs > 1 else ''}: "
                   + "; ".join(parts))  # fmt: skip
    return out


def winners_html(cells: Sequence[CellRow]) -> str:
    lines = winners(cells)
    if not lines:
        return ""
    return ("<h3>Network: which topology won (seed 002's summary)</h3>"
            + "".join(f"<p class='verdict'>{html.escape(line)}</p>" for line in lines))  # fmt: skip
