"""The HTML report: environment, seed verdicts, charts (matplotlib, embedded
as PNG) and the full cell table. Runs of different accelerators get separate
sections; nothing is compared across them.
"""

from __future__ import annotations

import base64
import difflib
import io
import re
import time
from collections.abc import Sequence
from typing import Any

from kvmtune.bench.net.claims import net_tier, verified_claim_line, verified_claims
from kvmtune.bench.report_net import claim_rows as net_claim_rows
from kvmtune.bench.report_net import configuration_names, net_sections
from kvmtune.bench.report_parts import (
    CHART_METRICS,
    claims_table,
    grouped_chart,
    percentile_table,
    ratio_chart,
    verified_table,
)
from kvmtune.bench.report_workload import number, profile_charts
from kvmtune.bench.verdicts import cell_tier, verdicts
from kvmtune.errors import InputError, KvmtuneError
from kvmtune.lab.stats import group_metric, median, summarize
from kvmtune.lab.store import CellRow, RunRow, Store
from kvmtune.lab.vocabulary import legend_html
from kvmtune.textsafe import html_safe


def _plt() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise KvmtuneError(
            "matplotlib is not installed: pip install 'kvmtune[report]' (or apt install python3-matplotlib)"
        ) from None
    return plt


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    _plt().close(fig)
    return base64.b64encode(buf.getvalue()).decode()


_FFSB = re.compile(r"ffsb-(\w+)-t(\d+)-(direct|buffered)")


def thread_scaling_chart(cells: Sequence[CellRow]) -> list[tuple[str, str]]:
    """Seed 000 style: MB/s against threads, a line per configuration and I/O mode, one panel per operation."""
    plt = _plt()
    pts: dict[str, dict[str, dict[int, list[float]]]] = {}
    for c in cells:
        m = _FFSB.fullmatch(c.workload)
        if not m or c.status != "ok" or "bw_Bps" not in c.metrics:
            continue
        op, threads, mode = m.group(1), int(m.group(2)), m.group(3)
        line = f"{c.config.get('bus')} {mode}" + (f" {c.config.get('sched')}" if c.config.get("sched") != "default" else "")
        pts.setdefault(op, {}).setdefault(line, {}).setdefault(threads, []).append(c.metrics["bw_Bps"] / 1e6)
    if not pts:
        return []
    ops = sorted(pts)
    fig, axes = plt.subplots(1, len(ops), figsize=(3.2 * len(ops), 3.2), squeeze=False)
    for ax, op in zip(axes[0], ops, strict=False):
        for line, byt in sorted(pts[op].items()):
            xs = sorted(byt)
            ax.plot(xs, [median(byt[x]) for x in xs], marker="o", label=line)
        ax.set_title(op)
        ax.set_xlabel("threads")
        ax.set_ylabel("MB/s")
        ax.legend(fontsize=6)
    return [("FFSB operations: throughput against threads", _png(fig))]


def cycle_chart(store: Store, cells: Sequence[CellRow]) -> list[tuple[str, str]]:
    plt = _plt()
    cyc = [c for c in cells if "host_tps_per_vm" in c.metrics]
    if not cyc:
        return []
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for c in cyc:
        s = [(t, v) for t, n, v in store.samples(c.id) if n == "host_ios"]
        if len(s) < 2:
            continue
        ts = [(s[i][0] + s[i - 1][0]) / 2 for i in range(1, len(s))]
        rate = [(s[i][1] - s[i - 1][1]) / max(1e-6, s[i][0] - s[i - 1][0]) for i in range(1, len(s))]
        ax.plot(ts, rate, label=c.key.split("|")[0], linewidth=1)
    ax.set_xlabel("seconds since QEMU start")
    ax.set_ylabel("host disk transactions/s")
    ax.set_title("boot-write-shutdown cycle (seed 001)")
    ax.legend(fontsize=6)
    return [("host disk transactions/s during the cycle", _png(fig))]


def _fmt(v: float | None, scale: float = 1.0, digits: int = 0) -> str:
    return "" if v is None else f"{v / scale:,.{digits}f}"


def cell_table(cells: Sequence[CellRow]) -> str:
    rows = []
    for c in cells:
        m = c.metrics
        rows.append(
            "<tr>"
            + "".join(
                f"<td>{html_safe(x)}</td>"
                for x in (
                    c.key.split("|")[0],
                    c.workload,
                    str(c.rep),
                    c.status,
                    _fmt(m.get("iops")),
                    _fmt(m.get("bw_Bps"), 1e6, 1),
                    _fmt(m.get("clat_p99_us"), 1, 0),
                    _fmt(m.get("guest_cpu_busy_pct"), 1, 0),
                    _fmt(m.get("host_tps"), 1, 0),
                    _fmt(m.get("qemu_cpu_pct"), 1, 0),
                    c.error or "",
                )
            )
            + "</tr>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in ("configuration", "workload", "rep", "status", "IOPS", "MB/s", "p99 µs", "guest CPU %",
                  "host tps", "QEMU CPU %", "error")
    )
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def median_table(cells: Sequence[CellRow]) -> str:
    """One row per configuration × workload repeated over rounds: median IOPS and % of bare metal, each with its
    95 % interval (:func:`kvmtune.lab.stats.summarize`)."""
    iops, pct = group_metric(cells, "iops"), group_metric(cells, "pct_of_bare_metal")
    if not iops or max(len(v) for v in iops.values()) < 2:
        return ""
    rows = []
    for key, values in iops.items():
        config, workload = key.split("|", 1)
        share = summarize(pct[key]).text() if key in pct and not config.startswith("host/") else ""
        rows.append("<tr>" + "".join(f"<td>{html_safe(x)}</td>" for x in (
            config, workload, str(len(values)), summarize(values).text(), share)) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("configuration", "workload", "rounds", "IOPS: median [95 % interval]",
                                             "% of bare metal: median [95 % interval]"))
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


CSS = """body{font-family:sans-serif;max-width:1250px;margin:1em auto;color:#222}
table{border-collapse:collapse;font-size:12px;margin:.4em 0 1em}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}
td.num{text-align:right}.warn{background:#fff3cd;padding:.5em;border:1px solid #e0c060}
.badge{color:#fff;border-radius:3px;padding:1px 7px;white-space:nowrap;font-size:11px}
.badge,.swatch{-webkit-print-color-adjust:exact;print-color-adjust:exact}
.summary{background:#f4f6f8;border:1px solid #d0d7de;padding:.6em 1em;margin-bottom:1em}
img,svg{max-width:100%;height:auto}h3{margin-bottom:.2em}.note{color:#555}
.swatch{display:inline-block;width:10px;height:10px;margin-right:5px}
td:first-child,td.num{white-space:nowrap}.charts{display:flex;flex-wrap:wrap;column-gap:24px}.chart h3{max-width:600px}
table.claims{width:100%}table.claims td:first-child{white-space:normal;min-width:5em}
@media print{body{max-width:none;margin:0}.chart{page-break-inside:avoid}h2{page-break-before:auto}
h1,h2,h3{break-after:avoid;page-break-after:avoid}tr{break-inside:avoid}}"""

TIER_WORDS = {"guest": "probe guest (fio inside a booted guest)", "block": "block tier (qemu-storage-daemon + fio "
              "over NBD: QEMU's block layer at host speed, no guest)", "quick": "quick tier (qemu-img bench)"}


def _section_title(accel: str, tiers: set[str]) -> str:
    """What the numbers of one section are: a tier without a guest has no accelerator to name."""
    words = ", ".join(TIER_WORDS.get(t, t) for t in sorted(tiers))
    if tiers and tiers <= {"block", "quick"}:
        return f"Measured on the {words}"
    return f"Accelerator {accel}: {words}"


def baseline_names(store: Store, run_ids: Sequence[int]) -> set[str]:
    """The configuration names ``--baseline`` may take: storage configurations as kvmtune prints them
    (``nbd/raw-off/none/native``) and network configurations as the legends print them (``ovs (userspace) MTU 1500``)."""
    cells = [c for r in run_ids if store.run(r).kind != "verify" for c in store.cells(r) if c.status == "ok"]
    storage = {c.key.split("|")[0] for c in cells if "topology" not in c.config}
    return storage | configuration_names([c for c in cells if "topology" in c.config])


def resolve_baseline(given: str, names: set[str]) -> str:
    """``--baseline``: a configuration name, or the start of exactly one; anything else is refused (exit 2) with the
    closest names."""
    if given in names:
        return given
    starts = sorted(n for n in names if n.startswith(given))
    if len(starts) == 1:
        return starts[0]
    if starts:
        raise InputError("--baseline", f"{given!r} begins {len(starts)} configurations ({', '.join(starts[:6])}"
                                       f"{', …' if len(starts) > 6 else ''}): give more of the name")
    close = difflib.get_close_matches(given, sorted(names), n=3, cutoff=0.4)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}?" if close else "these runs have no configuration like it"
    listed = ", ".join(sorted(names)[:8]) + (", …" if len(names) > 8 else "")
    raise InputError("--baseline", f"{given!r} names no configuration of these runs; {hint} (they are: "
                                   f"{listed or 'none'})")


def render(store: Store, run_ids: Sequence[int], baseline: str | None = None) -> str:
    runs: list[RunRow] = [store.run(r) for r in run_ids]
    verified = [c for r in runs if r.kind == "verify" for c in store.cells(r.id)]
    cells_by_accel: dict[str, list[CellRow]] = {}
    for r in runs:
        if r.kind == "verify":
            continue
        for c in store.cells(r.id):
            cells_by_accel.setdefault(c.accel or r.accel or "none", []).append(c)
    storage = {a: [c for c in cs if "topology" not in c.config and c.status != "interrupted"]
               for a, cs in cells_by_accel.items()}
    claim_rows: list[tuple[str, Any]] = []
    for accel, cells in sorted(storage.items()):
        by_tier: dict[str, list[CellRow]] = {}
        for c in cells:
            by_tier.setdefault(cell_tier(c), []).append(c)
        for tier, tier_cells in sorted(by_tier.items()):  # never one verdict across tiers
            label = tier if tier in ("block", "quick") else f"{tier}, {accel}"
            claim_rows.extend((label, v) for v in verdicts(tier_cells))
    net_cells = [c for cs in cells_by_accel.values() for c in cs if "topology" in c.config]
    claim_rows.extend(net_claim_rows(net_cells))
    claim_rows.extend((f"verify: {where}", claim) for where, claim in verified_claims(verified))
    env = runs[0].env if runs else {}
    n_cells = sum(len(cs) for cs in cells_by_accel.values()) + len(verified)
    tiers_all = sorted({cell_tier(c) for cs in storage.values() for c in cs} | {cell_tier(c) for c in verified}
                       | {f"network {net_tier(c)}" for c in net_cells})
    # an accelerator belongs to a tier that boots a guest; the others have none to name
    accels = sorted({a for a, cs in storage.items() for c in cs if cell_tier(c) == "guest"}
                    | {c.accel or "?" for c in net_cells if net_tier(c) == "guest"})
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>kvmtune report</title><style>{CSS}</style>"
             "</head><body>"]
    parts.append("<h1>kvmtune benchmark report</h1>")
    parts.append(
        "<div class='summary'><p><b>Host</b>: " + html_safe(str(env.get("cpu_model") or "CPU unknown"))
        + f", {html_safe(str(env.get('ncpu') or '?'))} CPUs, kernel {html_safe(str(env.get('host_kernel') or '?'))}"
        + f", QEMU {html_safe(str(env.get('qemu') or '–'))}.</p><p><b>Measured</b>: {len(runs)} run(s) ("
        + ", ".join(html_safe(f"#{r.id} {r.kind}" + (f" {r.preset}" if r.preset else "")) for r in runs)
        + f"), {n_cells} cells; tier(s): {html_safe(', '.join(tiers_all) or 'none')}; accelerator(s): "
        + html_safe(", ".join(accels) or "none (no guest)")
        + f". Generated {time.strftime('%Y-%m-%d %H:%M')}.</p>"
        + (f"<p><b>Normalised to</b>: {html_safe(baseline)} = 100 %.</p>" if baseline else "")
        + replay_table(runs)
        + ("<h2>Verified fixes</h2>" + verified_table(verified) + ratio_chart(verified) if verified else "")
        + ("<h2>Seed claims, measured here</h2>" + claims_table(claim_rows) if claim_rows else "")
        + (legend_html() if claim_rows or verified else "")
        + "</div>")
    parts.append("<h2>Runs</h2><table><tr><th>run</th><th>kind</th><th>preset or setup</th><th>status</th><th>accel</th>"
                 "<th>host kernel</th><th>QEMU</th><th>fio</th><th>CPU</th><th>note</th></tr>")
    for r in runs:
        e = r.env
        parts.append("<tr>" + "".join(
            f"<td>{html_safe(str(x))}</td>"
            for x in (r.id, r.kind, r.preset or _setup(r), r.status, r.accel or "–", e.get("host_kernel", ""), e.get("qemu", ""),
                      e.get("fio", ""), e.get("cpu_model", ""), r.note or "")) + "</tr>")
    parts.append("</table>")
    if len(cells_by_accel) > 1:
        parts.append("<p class='warn'>These runs used different accelerators ("
                     + ", ".join(html_safe(a) for a in sorted(cells_by_accel))
                     + "). Each gets its own section; no number is compared across them.</p>")
    for accel, cells in sorted(storage.items()):
        if not cells:
            continue
        tiers = {cell_tier(c) for c in cells}
        parts.append(f"<h2>{html_safe(_section_title(accel, tiers))}</h2>")
        if accel == "tcg" and "guest" in tiers:
            parts.append("<p class='warn'>Measured under TCG (software emulation): the guest's CPU cost dominates, so "
                         "these are emulation numbers, not what a KVM guest gets.</p>")
        if any(r.status != "complete" for r in runs):
            parts.append("<p class='warn'>Some runs are partial or had failing cells; see the table.</p>")
        parts.append("<div class='charts'>")
        for workload in sorted({c.workload for c in cells if not c.workload.startswith("ffsb-")}):
            for metric, unit, scale in CHART_METRICS:
                svg = grouped_chart(cells, workload, metric, unit, scale, baseline)
                if svg:
                    parts.append(f"<div class='chart'><h3>{html_safe(workload)}: {html_safe(unit)}</h3>{svg}</div>")
        parts.append("</div>")
        for title, png in _matplotlib_charts(store, cells):
            parts.append(f"<div class='chart'><h3>{html_safe(title)}</h3>"
                         f"<img alt='{html_safe(title)}' src='data:image/png;base64,{png}'></div>")
        table = percentile_table(cells)
        if table:
            parts.append("<h3>Completion latency percentiles</h3>" + table)
        medians = median_table(cells)
        if medians:
            parts.append("<h3>Median over rounds, with 95 % interval</h3>" + medians)
        parts.append("<h3>All cells</h3>" + cell_table(cells))
    parts.extend(net_sections(net_cells, baseline))
    parts.append("</body></html>")
    return "\n".join(parts)


def replay_table(runs: Sequence[RunRow]) -> str:
    """The captured workloads the runs replayed (bench storage --replay, verify --replay): each one's profile, shown
    beside the verdicts measured with it. Every value from the database goes through html_safe."""
    rows, charts = [], []
    for r in runs:
        rep = r.env.get("replay")
        if not isinstance(rep, dict):
            continue
        raw = rep.get("profile")
        p: dict[str, Any] = raw if isinstance(raw, dict) else {}
        charts.append(profile_charts(p, f"run #{r.id}: the workload of disk {rep.get('disk', '?')}"))

        def num(key: str, fmt: str, scale: float = 1.0, p: dict[str, Any] = p) -> str:
            v = number(p.get(key))  # a shared database's number: NaN, or 400 digits that no float holds, is "–"
            return fmt.format(v / scale) if v is not None else "–"

        how = "synthesized from statistics" if rep.get("synthesized") else str(rep.get("source", "?"))
        cells = (f"#{r.id} {r.kind}", rep.get("disk", "?"), f"{how}, {rep.get('mode', '?')}",
                 num("iops", "{:.0f}"), num("read_fraction", "{:.0%}"), num("size_mean", "{:.1f} KiB", 1024),
                 num("sequential_fraction", "{:.0%}"), f"{num('depth_mean', '{:.1f}')} / {num('depth_p95', '{:.0f}')}",
                 num("flush_per_write", "{:.3f}"), str(rep.get("digest", ""))[:16])
        rows.append("<tr>" + "".join(f"<td>{html_safe(str(x))}</td>" for x in cells) + "</tr>")
    if not rows:
        return ""
    return ("<h2>Replayed workloads</h2><table><tr><th>run</th><th>disk</th><th>replayed as</th><th>captured IOPS</th>"
            "<th>reads</th><th>mean size</th><th>sequential</th><th>depth mean / p95</th><th>flush/write</th>"
            "<th>sha256</th></tr>" + "".join(rows) + "</table>" + "".join(charts))


def _setup(run: RunRow) -> str:
    """A network run's topology, MTU, hosts and pairs (storage runs without a preset show nothing)."""
    a = run.args
    if "topology" not in a:
        return ""
    return (f"{a['topology']}, MTU {a.get('mtu', '?')}, {a.get('hosts', '?')} host(s), {a.get('pairs', '?')} pair(s)"
            + (f", {a['tune']}" if a.get("tune") else ""))


def _matplotlib_charts(store: Store, cells: Sequence[CellRow]) -> list[tuple[str, str]]:
    """Thread scaling and the boot cycle, where matplotlib is installed (the grouped bars need it not)."""
    try:
        _plt()
    except KvmtuneError:
        return []
    return thread_scaling_chart(cells) + cycle_chart(store, cells)


def verified_fix_lines(cells: Sequence[Any]) -> list[str]:
    """The "verified fixes" lines of ``kvmtune report`` from the stored cells of a verify run, then the seed claims
    its guest-tier fixes answer (each naming the tier and accelerator)."""
    out = []
    for c in cells:
        cfg = c.config
        head = f"{cfg.get('rule')} {cfg.get('target')}: {cfg.get('change')}"
        m = c.metrics
        if c.status != "ok" or "before" not in m:
            out.append(f"{head}: not measured ({c.error or c.status})")
            continue
        text = f"{head}: {cfg.get('metric')} {m['before']:,.4g} -> {m['after']:,.4g} {cfg.get('unit') or ''}".rstrip()
        if "ratio" in m:
            text += f", ratio {m['ratio']:.2f}"
        if "ratio_ci_low" in m:
            text += f" [{m['ratio_ci_low']:.2f}, {m['ratio_ci_high']:.2f}]"
        tier = f"{cfg.get('tier')} tier" + (", TCG emulation" if cfg.get("accel") == "tcg" else "")
        out.append(f"{text}; {cfg.get('verdict')}; {cfg.get('action')} ({tier})")
    out.extend(verified_claim_line(claim) for _, claim in verified_claims(cells))
    return out
