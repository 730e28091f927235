"""``kvmtune results list|show``: what the results database holds."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from kvmtune.bench.prometheus import render_run
from kvmtune.bench.stats import cell_summaries
from kvmtune.bench.store import Store
from kvmtune.bench.workdir import default_db
from kvmtune.textsafe import safe


def register(sub: Any) -> None:
    p = sub.add_parser("results", help="list stored benchmark runs or show one")
    rs = p.add_subparsers(dest="results_cmd", metavar="ACTION", parser_class=type(p))
    ls = rs.add_parser("list", help="one line per run")
    ls.add_argument("--db", type=Path, help=f"results database (default {default_db()})")
    ls.set_defaults(func=run_list)
    sh = rs.add_parser("show", help="the cells of one run")
    sh.add_argument("run", type=int, metavar="RUN")
    sh.add_argument("--db", type=Path, help=f"results database (default {default_db()})")
    sh.add_argument("--json", action="store_true", help="machine-readable output (same as --format json)")
    sh.add_argument("--format", choices=("text", "json", "prometheus"), default="text",
                    help="prometheus: node_exporter textfile gauges with units (benchmark and verify runs)")
    sh.set_defaults(func=run_show)
    p.set_defaults(func=lambda _a: (p.print_help(), 2)[1])


def run_list(args: argparse.Namespace) -> int:
    if args.db is None and not default_db().exists():
        print(f"no runs yet ({default_db()} does not exist; 'kvmtune bench' creates it)")
        return 0
    with Store(args.db or default_db(), must_exist=True) as st:
        runs = st.runs()
        if not runs:
            print(f"no runs in {st.path}")
            return 0
        print(f"{'run':>4} {'started':19} {'kind':8} {'preset':14} {'accel':5} {'status':9} {'cells':>5} {'failed':>6} note")
        for r in runs:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.started))
            print(
                f"{r.id:>4} {when:19} {safe(r.kind):8} {safe(r.preset or '-'):14} {safe(r.accel or '-'):5} {safe(r.status):9}"
                f" {r.cells:>5} {r.failed:>6} {safe(r.note or '')}".rstrip()
            )
    return 0


# (metric, scale, width, digits, prefix, unit shown): what one line per cell shows
STORAGE_COLUMNS = (("iops", 1.0, 10, 0, "", "IOPS"), ("bw_Bps", 1e6, 8, 1, "", "MB/s"), ("clat_p99_us", 1.0, 8, 0, "p99 ", "µs"))
NET_COLUMNS = (
    ("throughput_Bps", 1e6, 9, 2, "", "MB/s"), ("tps", 1.0, 10, 0, "", "tx/s"), ("lat_avg_us", 1.0, 9, 1, "avg ", "µs"),
)  # fmt: skip


def _figure(metrics: dict[str, float], name: str, scale: float, width: int, digits: int, prefix: str, unit: str) -> str:
    """One figure, or "–" where the tier did not measure it (qemu-img bench has no latency percentiles)."""
    value = metrics.get(name)
    text = "–" if value is None else f"{value / scale:,.{digits}f}"
    return f"{prefix}{text:>{width}} {unit}"


def run_show(args: argparse.Namespace) -> int:
    with Store(args.db or default_db(), must_exist=True) as st:
        run = st.run(args.run)
        cells = st.cells(run.id)
        if args.format == "prometheus":
            print(render_run(run, cells), end="")
            return 0
        if args.json or args.format == "json":
            print(json.dumps({
                "run": {"id": run.id, "kind": run.kind, "preset": run.preset, "status": run.status, "note": run.note,
                        "accel": run.accel, "env": run.env},
                "cells": [{"key": c.key, "config": c.config, "workload": c.workload, "rep": c.rep,
                           "status": c.status, "error": c.error, "metrics": c.metrics} for c in cells],
                "summary": cell_summaries(cells),  # per key and metric over the rounds: median, 95 % interval
            }, indent=1))  # fmt: skip
            return 0
        if run.env.get("tier") == "datapath":  # no QEMU, no fio: what ran is netload on the host's datapath
            print(f"run {run.id} ({safe(run.kind)}, datapath tier, {safe(run.status)}, no guest): "
                  f"{safe(run.env.get('netload'))}, {safe(', '.join(run.env.get('topologies') or []))}")  # fmt: skip
        else:
            print(f"run {run.id} ({safe(run.kind)}, {safe(run.status)}, accelerator {safe(run.accel)}): "
                  f"{safe(run.env.get('qemu'))}, {safe(run.env.get('fio'))}")  # fmt: skip
        columns = NET_COLUMNS if run.kind == "net" else STORAGE_COLUMNS
        if run.note:
            print(f"note: {safe(run.note)}")
        for c in cells:
            if c.status != "ok":
                print(f"  {safe(c.key.split('|')[0]):45} {safe(c.workload):28} {safe(c.status)}: {safe(c.error)}")
                continue
            figures = " ".join(_figure(c.metrics, *col) for col in columns)
            extra = f" {c.metrics['host_tps_per_vm']:.1f} tps/VM" if "host_tps_per_vm" in c.metrics else ""
            print(f"  {safe(c.key.split('|')[0]):45} {safe(c.workload):28} {figures}{extra}")
        if run.kind != "net":
            from kvmtune.cli.bench import median_lines

            for line in median_lines(cells):
                print(safe(line))  # configuration and workload names from the database
    return 0
