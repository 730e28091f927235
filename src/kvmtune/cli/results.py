"""``kvmtune results list|show``: what the results database holds."""

from __future__ import annotations

import argparse
import json
import time

from kvmtune.bench.prometheus import render_run
from kvmtune.cli.command import Command, Outcome, db_option, format_option, results_db, results_db_named
from kvmtune.lab.stats import cell_summaries
from kvmtune.lab.store import Store
from kvmtune.lab.workdir import default_db
from kvmtune.textsafe import safe


class ResultsListCommand(Command):
    name = "list"
    uses_settings = True  # its --db: the settings file's db (results_db)
    help = "one line per run"

    def options(self, p: argparse.ArgumentParser) -> None:
        db_option(p)

    def run(self, args: argparse.Namespace) -> Outcome:
        if not results_db_named(args) and not default_db().exists():
            return Outcome(result=f"no runs yet ({default_db()} does not exist; 'kvmtune bench' creates it)\n")
        with Store(results_db(args), must_exist=True) as st:
            runs = st.runs()
            if not runs:
                return Outcome(result=f"no runs in {st.path}\n")
            lines = [f"{'run':>4} {'started':19} {'kind':8} {'preset':14} {'accel':5} {'status':9} {'cells':>5} "
                     f"{'failed':>6} note"]
            for r in runs:
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.started))
                lines.append(
                    f"{r.id:>4} {when:19} {safe(r.kind):8} {safe(r.preset or '-'):14} {safe(r.accel or '-'):5} "
                    f"{safe(r.status):9} {r.cells:>5} {r.failed:>6} {safe(r.note or '')}".rstrip()
                )
        return Outcome(result="".join(f"{line}\n" for line in lines))


class ResultsShowCommand(Command):
    name = "show"
    uses_settings = True  # its --db: the settings file's db (results_db)
    help = "the cells of one run"

    def options(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("run", type=int, metavar="RUN")
        db_option(p)
        p.add_argument("--json", action="store_true", help="machine-readable output (same as --format json)")
        format_option(p, ("text", "json", "prometheus"),
                      help="prometheus: node_exporter textfile gauges with units (benchmark and verify runs)")

    def run(self, args: argparse.Namespace) -> Outcome:
        return Outcome(result=_show(args))


class ResultsCommand(Command):
    name = "results"
    help = "list stored benchmark runs or show one"
    subcommands = (ResultsListCommand, ResultsShowCommand)


COMMANDS = (ResultsCommand,)


# (metric, scale, width, digits, prefix, unit shown): what one line per cell shows
STORAGE_COLUMNS = (("iops", 1.0, 10, 0, "", "IOPS"), ("bw_Bps", 1e6, 8, 1, "", "MB/s"), ("clat_p99_us", 1.0, 8, 0, "p99 ", "µs"))
NET_COLUMNS = (
    ("throughput_Bps", 1e6, 9, 2, "", "MB/s"), ("tps", 1.0, 10, 0, "", "tx/s"), ("lat_avg_us", 1.0, 9, 1, "avg ", "µs"),
)


def _figure(metrics: dict[str, float], name: str, scale: float, width: int, digits: int, prefix: str, unit: str) -> str:
    """One figure, or "–" where the tier did not measure it (qemu-img bench has no latency percentiles)."""
    value = metrics.get(name)
    text = "–" if value is None else f"{value / scale:,.{digits}f}"
    return f"{prefix}{text:>{width}} {unit}"


def _show(args: argparse.Namespace) -> str:
    with Store(results_db(args), must_exist=True) as st:
        run = st.run(args.run)
        cells = st.cells(run.id)
        if args.format == "prometheus":
            return render_run(run, cells)
        if args.json or args.format == "json":
            return json.dumps({
                "run": {"id": run.id, "kind": run.kind, "preset": run.preset, "status": run.status, "note": run.note,
                        "accel": run.accel, "env": run.env},
                "cells": [{"key": c.key, "config": c.config, "workload": c.workload, "rep": c.rep,
                           "status": c.status, "error": c.error, "metrics": c.metrics} for c in cells],
                "summary": cell_summaries(cells),  # per key and metric over the rounds: median, 95 % interval
                # a captured workload's replay (bench storage --replay): digest (sha256), source, mode, disk
                "replay": run.env.get("replay"),
            }, indent=1) + "\n"
        lines: list[str] = []
        if run.env.get("tier") == "datapath":  # no QEMU, no fio: what ran is netload on the host's datapath
            lines.append(f"run {run.id} ({safe(run.kind)}, datapath tier, {safe(run.status)}, no guest): "
                         f"{safe(run.env.get('netload'))}, {safe(', '.join(run.env.get('topologies') or []))}")
        else:
            lines.append(f"run {run.id} ({safe(run.kind)}, {safe(run.status)}, accelerator {safe(run.accel)}): "
                         f"{safe(run.env.get('qemu'))}, {safe(run.env.get('fio'))}")
        columns = NET_COLUMNS if run.kind == "net" else STORAGE_COLUMNS
        if run.note:
            lines.append(f"note: {safe(run.note)}")
        rep = run.env.get("replay")
        if isinstance(rep, dict):
            what = "synthesized from statistics" if rep.get("synthesized") else f"{safe(rep.get('source'))}"
            lines.append(f"replay: disk {safe(rep.get('disk'))}, {what}, {safe(rep.get('mode'))}, "
                         f"sha256 {safe(rep.get('digest'))}")
        for c in cells:
            if c.status != "ok":
                lines.append(f"  {safe(c.key.split('|')[0]):45} {safe(c.workload):28} {safe(c.status)}: {safe(c.error)}")
                continue
            figures = " ".join(_figure(c.metrics, *col) for col in columns)
            extra = f" {c.metrics['host_tps_per_vm']:.1f} tps/VM" if "host_tps_per_vm" in c.metrics else ""
            lines.append(f"  {safe(c.key.split('|')[0]):45} {safe(c.workload):28} {figures}{extra}")
        if run.kind != "net":
            from kvmtune.cli.bench import median_lines

            lines.extend(safe(line) for line in median_lines(cells))  # configuration and workload names from the database
    return "".join(f"{line}\n" for line in lines)
