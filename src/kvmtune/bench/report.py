"""The HTML report: environment, seed verdicts, charts (matplotlib, embedded
as PNG) and the full cell table. Runs of different accelerators get separate
sections; nothing is compared across them.
"""

from __future__ import annotations

import base64
import html
import io
import re
import time
from collections.abc import Sequence
from typing import Any

from kvmtune.bench.stats import mean, stdev
from kvmtune.bench.store import CellRow, RunRow, Store
from kvmtune.bench.verdicts import cell_tier, verdicts
from kvmtune.errors import KvmtuneError


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


def _series(cells: Sequence[CellRow], metric: str) -> dict[tuple[str, str], list[float]]:
    out: dict[tuple[str, str], list[float]] = {}
    for c in cells:
        if c.status == "ok" and metric in c.metrics:
            out.setdefault((c.workload, c.key.split("|")[0]), []).append(c.metrics[metric])
    return out


def bars_chart(cells: Sequence[CellRow], metric: str = "iops", label: str = "IOPS") -> list[tuple[str, str]]:
    """One bar chart per workload: a bar per configuration (mean ± sd over repetitions)."""
    plt = _plt()
    data = _series(cells, metric)
    charts = []
    for workload in sorted({w for w, _ in data}):
        if workload.startswith("ffsb-"):
            continue  # shown as thread scaling
        items = sorted((cfg, v) for (w, cfg), v in data.items() if w == workload)
        if not items:
            continue
        fig, ax = plt.subplots(figsize=(max(5.0, 0.45 * len(items) + 2), 3.6))
        ys = [mean(v) for _, v in items]
        # an error bar only where there is an interval (two or more rounds); one round gets none, not a zero-width cap
        errs = [stdev(v) if len(v) > 1 else float("nan") for _, v in items]
        ax.bar(range(len(items)), ys, yerr=errs if any(len(v) > 1 for _, v in items) else None, color="#4477aa",
               capsize=3)  # fmt: skip
        ax.set_xticks(range(len(items)))
        ax.set_xticklabels([k for k, _ in items], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel(label)
        ax.set_title(f"{workload}: {label} per configuration")
        charts.append((f"{workload} — {label}", _png(fig)))
    return charts


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
            ax.plot(xs, [mean(byt[x]) for x in xs], marker="o", label=line)
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
                f"<td>{html.escape(x)}</td>"
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
    )  # fmt: skip
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


CSS = """body{font-family:sans-serif;max-width:1200px;margin:1em auto;color:#222}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}
td:first-child,td:nth-child(2),td:last-child{text-align:left}.warn{background:#fff3cd;padding:.5em;border:1px solid #e0c060}
.verdict{font-family:monospace;margin:.3em 0}img{max-width:100%}"""


def render(store: Store, run_ids: Sequence[int]) -> str:
    runs: list[RunRow] = [store.run(r) for r in run_ids]
    cells_by_accel: dict[str, list[CellRow]] = {}
    for r in runs:
        for c in store.cells(r.id):
            cells_by_accel.setdefault(c.accel or r.accel or "unknown", []).append(c)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>kvmtune report</title><style>{CSS}</style></head><body>"]
    parts.append(f"<h1>kvmtune storage report</h1><p>generated {time.strftime('%Y-%m-%d %H:%M:%S')}</p>")
    parts.append(
        "<h2>Runs</h2><table><tr><th>run</th><th>kind</th><th>preset</th><th>status</th><th>accel</th>"
        "<th>host kernel</th><th>QEMU</th><th>fio</th><th>CPU</th><th>host I/O scheduler</th></tr>"
    )
    for r in runs:
        e = r.env
        parts.append(
            "<tr>" + "".join(
                f"<td>{html.escape(str(x))}</td>"
                for x in (r.id, r.kind, r.preset or "", r.status, r.accel, e.get("host_kernel", ""), e.get("qemu", ""),
                          e.get("fio", ""), e.get("cpu_model", ""), e.get("host_io_scheduler", ""))
            ) + "</tr>"
        )  # fmt: skip
    parts.append("</table>")
    if len(cells_by_accel) > 1:
        parts.append(
            "<p class='warn'>These runs used different accelerators ("
            + ", ".join(html.escape(a) for a in sorted(cells_by_accel))
            + "). Each gets its own section; no number is compared across them.</p>"
        )
    for accel, cells in sorted(cells_by_accel.items()):
        parts.append(f"<h2>Accelerator: {html.escape(accel)}</h2>")
        if accel == "tcg":
            parts.append(
                "<p class='warn'>Measured under TCG (software emulation): the guest's CPU cost dominates, so these "
                "numbers show how this host's QEMU block layer behaves under emulation, not what a KVM guest gets.</p>"
            )
        if any(r.status != "complete" for r in runs):
            parts.append("<p class='warn'>Some runs are partial or had failing cells; see the table.</p>")
        parts.append("<h3>Seed claims, measured here</h3>")
        by_tier: dict[str, list[CellRow]] = {}
        for c in cells:
            if "topology" not in c.config and c.status != "interrupted":
                by_tier.setdefault(cell_tier(c), []).append(c)
        for tier, tier_cells in sorted(by_tier.items()):  # never one verdict across tiers
            for v in verdicts(tier_cells):
                parts.append(f"<p class='verdict'>{html.escape(v.line(tier))}</p>")
        charts = (
            thread_scaling_chart(cells) + bars_chart(cells) + bars_chart(cells, "bw_Bps", "bytes/s") + cycle_chart(store, cells)
        )
        for title, png in charts:
            parts.append(f"<h3>{html.escape(title)}</h3><img alt='{html.escape(title)}' src='data:image/png;base64,{png}'>")
        parts.append("<h3>All cells</h3>" + cell_table(cells))
    parts.append("</body></html>")
    return "\n".join(parts)
