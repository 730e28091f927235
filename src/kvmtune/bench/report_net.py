"""Network runs in the HTML report and in ``compare --html``: the same design as the storage report.

A section per tier and accelerator: seed 002's "which topology won" table, grouped bars (workload and
user count along x, one colour per configuration, a chart per metric family: throughput, transactions/s,
transaction time, CPU per MB), 95 % whiskers where a configuration was run more than once, log axes
where values span more than 20×, ``--baseline`` as % of one configuration test by test (the way seed 002
draws "run B vs run A"), and transaction-time percentiles. All charts are inline SVG (:mod:`.svgchart`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from kvmtune.bench.net.chart import BARS, Row, _order
from kvmtune.bench.net.claims import CATEGORIES, NetClaim, Setup, net_claims, net_tier, per_run, winners_by_setting
from kvmtune.bench.report_parts import claims_table, point
from kvmtune.bench.svgchart import Bar, BarChart, XKey, bar_chart
from kvmtune.lab.metrics import lookup
from kvmtune.lab.stats import median
from kvmtune.lab.store import CellRow, RunRow
from kvmtune.lab.vocabulary import legend_html
from kvmtune.textsafe import html_safe

e = html_safe

NET_TIER_WORDS = {
    "guest": "probe guests (netload between guests)",
    "datapath": "datapath tier (netload in the namespaces where the guests' taps would be: the host's datapath "
                "at host speed, no QEMU, no guest)",
}
# seed 002's bar colours: throughput blue, transaction time orange, client CPU yellow, server CPU green
SEED002_COLOURS = ("#4477aa", "#ee7733", "#ccbb44", "#228833")
PERCENTILES = (("lat_p50_us", "p50"), ("lat_p90_us", "p90"), ("lat_p99_us", "p99"), ("lat_p99_9_us", "p99.9"))


def section_title(tier: str, accel: str) -> str:
    if tier == "datapath":
        return "Network: datapath tier (no guest)"
    return f"Network: probe guests, accelerator {accel}"


def series_labels(setups: Sequence[Setup]) -> dict[Setup, str]:
    """A legend label per configuration naming only what varies between them (the topology always)."""

    def varies(field: str) -> bool:
        return len({getattr(s, field) for s in setups}) > 1

    out = {}
    for s in setups:
        bits = [s.name]
        if varies("mtu"):
            bits.append(f"MTU {s.mtu}")
        if varies("hosts"):
            bits.append(f"{s.hosts} host{'s' if s.hosts > 1 else ''}")
        if varies("pairs"):
            bits.append(f"{s.pairs} pair{'s' if s.pairs > 1 else ''}")
        if varies("tunings"):
            bits.append(s.tunings or "untuned")
        out[s] = " ".join(bits)
    return out


def _x(test: str) -> XKey:
    workload, _, users = test.partition("--")
    return ("", workload, users)


def resolve_baseline(baseline: str | None, labels: set[str]) -> str | None:
    """The configuration ``--baseline`` names here, when it is one of these labels (the CLI has already completed
    it to a full name: :func:`kvmtune.bench.report.resolve_baseline`)."""
    return baseline if baseline in labels else None


def configuration_names(cells: Sequence[CellRow]) -> set[str]:
    """Every network configuration's name as the charts' legends print it, over the report's sections."""
    return {label for group in sections(cells).values() for label in series_labels(list(per_run(group))).values()}


def _rr(workload: str) -> bool:
    return workload.startswith("rr")


def _stream(workload: str) -> bool:
    return not workload.startswith("rr")


def _throughput_unit(peak_Bps: float) -> tuple[str, float]:
    """Gb/s for real datapaths, Mb/s where nothing reaches a gigabit (TCG guests)."""
    return ("Gb/s", 1.25e8) if peak_Bps >= 1.25e8 else ("Mb/s", 1.25e5)


def metric_chart(data: dict[Setup, dict[int, dict[str, dict[str, float]]]], labels: dict[Setup, str],
                 metric: str, unit: str, scale: float, baseline: str | None,
                 keep: Callable[[str], bool] | None = None) -> tuple[str, str | None]:
    """(svg, the baseline label actually used or None) for one metric family, over the workloads ``keep`` takes."""
    raw: dict[tuple[XKey, str], list[float]] = {}
    tests: set[str] = set()
    for setup, runs in data.items():
        for run in runs.values():
            for test, metrics in run.items():
                if metric in metrics:
                    raw.setdefault((_x(test), labels[setup]), []).append(metrics[metric] / scale)
                    tests.add(test)
    raw = {(x, label): v for (x, label), v in raw.items() if keep is None or keep(x[1])}
    if not raw:
        return "", None
    points = {k: point(v) for k, v in raw.items()}
    about = lookup(metric)
    better = "" if about is None else {"higher": " (higher is better)", "lower": " (lower is better)"}.get(
        about.better.value, "")
    name = about.label if about is not None else metric
    name = name.replace("per MB", "per GB") if unit == "s/GB" else name
    y_title = f"{name}{'' if unit == 'tx/s' else ', ' + unit}{better}"  # not "transactions/s, tx/s"
    used = None
    baseline = resolve_baseline(baseline, set(labels.values()))
    if baseline:
        base = {x: p.value for (x, s), p in points.items() if s == baseline and p.value > 0}
        points = {(x, s): p.scaled(100 / base[x]) for (x, s), p in points.items() if x in base}
        y_title, used = f"{name}, % of {baseline} in the same test{better}", baseline
    xs = [_x(t) for t in sorted(tests, key=_order)]
    series = sorted(set(labels.values()))
    bars = {k: p.bar() for k, p in points.items()}
    svg = bar_chart(BarChart(label=y_title, y_title=y_title, xs=xs, series=series, bars=bars,
                             series_title="configuration:", reference=100.0 if used else None,
                             level_names=("", "workload", "users"),
                             footnote="x: workload, then users; bars: median over runs (pairs summed or averaged "
                                      "within a run), the tables' figure; whiskers: its 95 % interval (Student's t on "
                                      "the logarithms) where a configuration ran more than once"))
    return svg, used


def winners_table(data: dict[Setup, Any]) -> str:
    """Seed 002's summary table (p. 57) as measured here: which topology moved the most, per setting and category."""
    rows = []
    for (mtu, hosts, pairs, tune), cats in winners_by_setting(data).items():
        cells = []
        for name, _w, _m in CATEGORIES:
            w = cats.get(name, "not measured")
            if isinstance(w, str) or not w.decided:
                cells.append(f"<td><i>{e(w if isinstance(w, str) else w.text())}</i></td>")
            else:
                cells.append(f"<td><b>{e(w.best)}</b>{e(w.text().removeprefix(w.best))}</td>")
        setting = f"MTU {mtu}, {hosts} host{'s' if hosts > 1 else ''}, {pairs} pair{'s' if pairs > 1 else ''}" + (
            f", {tune}" if tune else "")
        rows.append(f"<tr><td>{e(setting)}</td>{''.join(cells)}</tr>")
    return ("<table><tr><th>setting</th><th>small transactions (tx/s)</th><th>large transactions (tx/s)</th>"
            "<th>streaming (B/s)</th></tr>" + "".join(rows) + "</table>")


def percentile_table(data: dict[Setup, Any], labels: dict[Setup, str]) -> str:
    """Transaction-time percentiles (µs) per configuration and test: averaged over pairs, the median over runs."""
    rows = []
    for setup in sorted(data, key=lambda s: labels[s]):
        by_test: dict[str, dict[str, list[float]]] = {}
        for run in data[setup].values():
            for test, m in run.items():
                if not _rr(test):  # a stream's "transaction" is one write: its time is not a transaction's
                    continue
                for key, _ in PERCENTILES:
                    if key in m:
                        by_test.setdefault(test, {}).setdefault(key, []).append(m[key])
        for test in sorted(by_test, key=_order):
            vals = by_test[test]
            rows.append(f"<tr><td>{e(labels[setup])}</td><td>{e(test)}</td>" + "".join(
                f"<td class='num'>{_num(median(vals[k]))}</td>" if k in vals else "<td class='num'>–</td>"
                for k, _ in PERCENTILES) + "</tr>")
    if not rows:
        return ""
    head = "".join(f"<th>{n} µs</th>" for _, n in PERCENTILES)
    return f"<table><tr><th>configuration</th><th>test</th>{head}</tr>{''.join(rows)}</table>"


def _num(v: float | None, digits: int = 0) -> str:
    if v is None:
        return ""
    if v != 0 and abs(v) < 10 ** -digits * 10:
        return f"{v:.3g}"
    return f"{v:,.{digits}f}"


def cell_table(cells: Sequence[CellRow]) -> str:
    head = ("configuration", "test", "pair", "status", "MB/s", "tx/s", "avg µs", "p99 µs", "client CPU s/MB",
            "server CPU s/MB", "error")
    rows = []
    for c in sorted(cells, key=lambda c: (c.key.split("|")[0], _order(c.workload), c.rep)):
        m = c.metrics
        vals = (c.key.split("|")[0], c.workload, str(c.rep), c.status, _num(m.get("throughput_Bps", 0) / 1e6, 2)
                if "throughput_Bps" in m else "", _num(m.get("tps")), _num(m.get("lat_avg_us")), _num(m.get("lat_p99_us")),
                _num(m.get("client_cpu_s_per_mb"), 3), _num(m.get("server_cpu_s_per_mb"), 3), c.error or "")
        rows.append("<tr>" + "".join(f"<td>{e(v)}</td>" for v in vals) + "</tr>")
    return "<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>" + "".join(rows) + "</table>"


def claim_rows(cells: Sequence[CellRow]) -> list[tuple[str, NetClaim]]:
    """Seed 002's claims per tier and accelerator (never one verdict across them)."""
    out: list[tuple[str, NetClaim]] = []
    for (tier, accel), group in sorted(sections(cells).items()):
        label = "network datapath" if tier == "datapath" else f"network {tier}, {accel}"
        out.extend((label, c) for c in net_claims(group))
    return out


def sections(cells: Sequence[CellRow]) -> dict[tuple[str, str], list[CellRow]]:
    out: dict[tuple[str, str], list[CellRow]] = {}
    for c in cells:
        if "topology" in c.config and c.status != "interrupted":
            out.setdefault((net_tier(c), c.accel or "none"), []).append(c)
    return out


def net_sections(cells: Sequence[CellRow], baseline: str | None) -> list[str]:
    """The report's network sections, one per tier and accelerator."""
    parts: list[str] = []
    for (tier, accel), group in sorted(sections(cells).items()):
        data = per_run(group)
        labels = series_labels(list(data))
        parts.append(f"<h2>{e(section_title(tier, accel))}</h2><p class='note'>Measured on the "
                     f"{e(NET_TIER_WORDS.get(tier, tier))}.</p>")
        if tier == "guest" and accel == "tcg":
            parts.append("<p class='warn'>Measured under TCG (software emulation): the guests' CPU cost dominates, so "
                         "these are emulation numbers; the datapath tier measures the host's path at host speed.</p>")
        if tier == "datapath" and any(s.topology == "macvtap" for s in data):
            parts.append("<p class='note'>macvtap is measured through its namespace twin macvlan (the same "
                         "kernel driver without the tap character device).</p>")
        if any(c.status not in ("ok", "interrupted") for c in group):
            parts.append("<p class='warn'>Some cells failed; they are listed in the table below and left out of "
                         "the charts.</p>")
        if data:
            parts.append("<h3>Which topology won (seed 002's summary table, p. 57)</h3>" + winners_table(data))
        peak = max((m.get("throughput_Bps", 0.0) for runs in data.values() for run in runs.values()
                    for m in run.values()), default=0.0)
        tp_unit, tp_scale = _throughput_unit(peak)
        used_any = False
        parts.append("<div class='charts'>")
        # request/response tests: transactions/s and transaction time; streams: throughput and CPU per GB. No
        # chart (and no log axis) spans both kinds.
        for metric, title, unit, scale, keep in (
                ("tps", "Request/response: transactions per second", "tx/s", 1.0, _rr),
                ("lat_avg_us", "Request/response: transaction time (mean)", "µs", 1.0, _rr),
                ("throughput_Bps", "Streams: throughput", tp_unit, tp_scale, _stream),
                ("path_cpu_s_per_mb", "Streams: path CPU per GB (both netloads and the forwarding daemons)", "s/GB",
                 1e-3, _stream),
                ("client_cpu_s_per_mb", "Streams: client CPU per GB", "s/GB", 1e-3, _stream),
                ("server_cpu_s_per_mb", "Streams: server CPU per GB", "s/GB", 1e-3, _stream)):
            svg, used = metric_chart(data, labels, metric, unit, scale, baseline, keep)
            used_any = used_any or used is not None
            if svg:
                parts.append(f"<div class='chart'><h3>{e(title)}</h3>{svg}</div>")
        parts.append("</div>")
        if baseline and not used_any:
            parts.append(f"<p class='warn'>--baseline {e(baseline)} names no single network configuration here (they are: "
                         f"{e(', '.join(sorted(set(labels.values()))))}); the charts show absolute values.</p>")
        table = percentile_table(data, labels)
        if table:
            parts.append("<h3>Request/response: transaction time percentiles (median over runs)</h3>" + table)
        parts.append("<h3>All cells</h3>" + cell_table(group))
    return parts


# --------------------------------------------------------------------------- compare A B --html


def describe_run(run: RunRow, cells: Sequence[CellRow]) -> str:
    a = run.args
    first = next((c for c in cells if "topology" in c.config), None)
    cfg: dict[str, Any] = first.config if first else a
    bits = [str(cfg.get("topology", a.get("topology", run.kind))), f"MTU {cfg.get('mtu', a.get('mtu', '?'))}",
            f"{cfg.get('hosts', a.get('hosts', '?'))} host(s)", f"{cfg.get('pairs', a.get('pairs', '?'))} pair(s)"]
    tune = cfg.get("tunings") or a.get("tune")
    if tune:
        bits.append(", ".join(f"{k}={v}" for k, v in tune.items()) if isinstance(tune, dict) else str(tune))
    return f"run {run.id}: " + ", ".join(bits)


def run_setups(run: RunRow, cells: Sequence[CellRow]) -> set[Setup]:
    """The configurations a run's cells were measured in (the run's arguments for cells stored without them)."""
    found = {Setup.of(c) for c in cells if "topology" in c.config}
    if found:
        return found
    a = run.args
    return {Setup(str(a.get("topology", "?")), int(a.get("mtu") or 0), int(a.get("hosts") or 1),
                  int(a.get("pairs") or 1), str(a.get("tune") or ""))}


def differences(run_a: RunRow, cells_a: Sequence[CellRow], run_b: RunRow, cells_b: Sequence[CellRow]) -> list[str]:
    """What changed from A to B ("topology bridge → ovs"), when each run has one configuration."""
    sa, sb = run_setups(run_a, cells_a), run_setups(run_b, cells_b)
    if len(sa) != 1 or len(sb) != 1:
        return []
    a, b = sa.pop(), sb.pop()
    return [f"{name} {getattr(a, f) or 'none'} → {getattr(b, f) or 'none'}" for f, name in
            (("name", "topology"), ("mtu", "MTU"), ("hosts", "hosts"), ("pairs", "pairs"), ("tunings", "tunings"))
            if getattr(a, f) != getattr(b, f)]


def headline_table(rows: Sequence[Row]) -> str:
    """Per seed-002 figure: in how many tests B was better, the median and the range of the % differences."""
    out = []
    for (label, _metric), colour in zip(BARS, SEED002_COLOURS, strict=True):
        got = [v for r in rows if (v := r.pct[label]) is not None]
        if not got:
            out.append(f"<tr><td>{_swatch(colour)}{e(label)}</td><td colspan='3'><i>not measured</i></td></tr>")
            continue
        better = sum(1 for v in got if v > 0)
        out.append(f"<tr><td>{_swatch(colour)}{e(label)}</td><td class='num'>{better} of {len(got)}</td>"
                   f"<td class='num'>{statistics.median(got):+.1f} %</td>"
                   f"<td class='num'>{min(got):+.1f} % … {max(got):+.1f} %</td></tr>")
    return ("<table class='claims'><tr><th>seed 002 figure</th><th>tests where B is better</th><th>median "
            "difference</th><th>range</th></tr>" + "".join(out) + "</table>")


def _swatch(colour: str) -> str:
    return f"<span class='swatch' style='background:{colour}'></span>"


def compare_chart(rows: Sequence[Row]) -> str:
    bars = {(_x(r.test), label): Bar(v) for r in rows for label, _m in BARS if (v := r.pct[label]) is not None}
    if not bars:
        return ""
    peak = max(abs(b.value) for b in bars.values())
    return bar_chart(BarChart(
        label="B against A, % difference per test (positive = B better)",
        y_title="% difference, positive = B better", xs=[_x(r.test) for r in rows], series=[label for label, _ in BARS],
        bars=bars, colours=SEED002_COLOURS, percent=True, log=False, level_names=("", "workload", "users"),
        footnote="transaction time and CPU per MB are compared as rates (B faster or cheaper = positive)"
                 + (f"; largest difference {peak:,.0f} %" if peak > 300 else "")))


def compare_page(run_a: RunRow, run_b: RunRow, cells_a: Sequence[CellRow], cells_b: Sequence[CellRow],
                 rows: Sequence[Row], css: str) -> str:
    """``kvmtune compare A B --html`` for network runs: summary, seed 002's chart as inline SVG, the numbers."""
    env = run_b.env or run_a.env
    tiers = sorted({net_tier(c) for c in [*cells_a, *cells_b] if "topology" in c.config}) or ["guest"]
    differs = differences(run_a, cells_a, run_b, cells_b)
    claims = [(t, c) for t, c in claim_rows([*cells_a, *cells_b]) if c.measured is not None]
    tier_words = "; ".join(NET_TIER_WORDS.get(t, t) for t in tiers)
    accel = "none (no guest)" if tiers == ["datapath"] else (run_a.accel or "?")
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>kvmtune compare {run_a.id} {run_b.id}</title>"
             f"<style>{css}</style></head><body>",
             f"<h1>Network: run {run_b.id} (B) against run {run_a.id} (A)</h1>",
             "<div class='summary'>",
             f"<p><b>Host</b>: {e(str(env.get('cpu_model') or 'CPU unknown'))}, {e(str(env.get('ncpu') or '?'))} CPUs, "
             f"kernel {e(str(env.get('host_kernel') or '?'))}.</p>",
             f"<p><b>A</b> = {e(describe_run(run_a, cells_a))}<br><b>B</b> = {e(describe_run(run_b, cells_b))}</p>",
             f"<p><b>What differs</b>: {e('; '.join(differs) or 'nothing in the configuration (a repeat, or another host)')}"
             f". <b>Measured on</b>: {e(tier_words)}; accelerator {e(accel)}; {len(rows)} tests in common. "
             f"Generated {time.strftime('%Y-%m-%d %H:%M')}.</p>"]
    if run_a.accel == "tcg" or run_b.accel == "tcg":
        parts.append("<p class='warn'>Measured under TCG (software emulation): the guests' CPU cost dominates; the "
                     "differences show how the host-side path behaves under emulation, not what KVM guests get.</p>")
    parts.append("<h2>B against A, summed up</h2>" + headline_table(rows))
    if claims:
        parts.append("<h2>Seed 002's claims, measured by these two runs</h2>" + claims_table(claims) + legend_html())
    parts.append("</div>")
    svg = compare_chart(rows)
    if svg:
        parts.append("<div class='chart'><h2>% difference per test (seed 002's figures 10–19)</h2>" + svg + "</div>")
    head = ["test"] + [f"{label} %" for label, _ in BARS] + [
        "A MB/s", "B MB/s", "A tx/s", "B tx/s", "A avg µs", "B avg µs", "A p99 µs", "B p99 µs",
        "A client CPU s/MB", "B client CPU s/MB", "A server CPU s/MB", "B server CPU s/MB"]
    parts.append("<h2>The numbers behind it</h2><table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>")
    for r in rows:
        vals = [r.test] + [("" if r.pct[label] is None else f"{r.pct[label]:+.1f}") for label, _ in BARS]
        for metric, scale, digits in (("throughput_Bps", 1e6, 2), ("tps", 1, 0), ("lat_avg_us", 1, 0), ("lat_p99_us", 1, 0),
                                      ("client_cpu_s_per_mb", 1, 3), ("server_cpu_s_per_mb", 1, 3)):
            for side in (r.a, r.b):
                v = side.get(metric)
                vals.append("" if v is None else _num(v / scale, digits))
        parts.append("<tr>" + "".join(f"<td class='num'>{e(v)}</td>" if i else f"<td>{e(v)}</td>"
                                      for i, v in enumerate(vals)) + "</tr>")
    parts.append("</table></body></html>")
    return "\n".join(parts)

