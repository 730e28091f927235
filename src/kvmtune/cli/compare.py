"""``kvmtune compare RUN_A RUN_B``: differences with their uncertainty."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from kvmtune.cli.command import Command, Exit, Outcome, db_option, format_option, results_db
from kvmtune.errors import InputError, KvmtuneError
from kvmtune.lab.metrics import lookup
from kvmtune.lab.metrics import names as catalogue_names
from kvmtune.lab.stats import DEFAULT_METRICS, compare_cells
from kvmtune.lab.store import RunRow, Store
from kvmtune.lab.vocabulary import INCONCLUSIVE, NO_EFFECT
from kvmtune.textsafe import safe

# a run's kind names its tier (storage runs before tiers existed were guest runs)
TIER_OF_KIND = {"storage": "guest", "quick": "quick", "block": "block", "net": "network guest"}


def run_tier(run: RunRow) -> str:
    """The tier a run measured: its kind, and for network runs the tier stored with it (guest before tiers existed)."""
    if run.kind == "net":
        return f"network {run.env.get('tier') or 'guest'}"
    return TIER_OF_KIND.get(run.kind, run.kind)


class CompareCommand(Command):
    name = "compare"
    uses_settings = True  # its --db: the settings file's db (results_db)
    help = "compare two benchmark runs cell by cell"

    def options(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("run_a", type=int, metavar="RUN_A")
        p.add_argument("run_b", type=int, metavar="RUN_B")
        db_option(p)
        p.add_argument("--metric", action="append", help=f"metrics to compare (default {', '.join(DEFAULT_METRICS)})")
        p.add_argument("--threshold", type=float, default=5.0, help="smallest change in %% called a difference (default 5)")
        p.add_argument(
            "--across-accelerators", action="store_true",
            help="allow comparing runs made with different accelerators (the output says so loudly)",
        )
        format_option(p, ("text", "json"), help="json for scripts (network runs: seed 002's four %% figures per test)")
        p.add_argument("--html", type=Path,
                       help="network runs: write seed 002's chart (%% difference per test, B against A) here")

    def run(self, args: argparse.Namespace) -> Outcome:
        return run_compare(args)


COMMANDS = (CompareCommand,)


def run_compare(args: argparse.Namespace) -> Outcome:
    metrics = _metrics(args.metric)  # before the database: a typo is an error, not "nothing in common"
    with Store(results_db(args), must_exist=True) as st:
        a, b = st.run(args.run_a), st.run(args.run_b)
        tier_a, tier_b = run_tier(a), run_tier(b)
        if tier_a != tier_b:  # before the accelerators: no flag compares tiers
            raise KvmtuneError(
                f"run {a.id} is a {tier_a}-tier run and run {b.id} a {tier_b}-tier run: tiers measure different "
                "things (a guest, QEMU's block layer alone, qemu-img bench, the host's network datapath without a "
                "guest) and are never compared"
            )
        if a.accel != b.accel:
            if not args.across_accelerators:
                raise KvmtuneError(
                    f"run {a.id} used {a.accel} and run {b.id} used {b.accel}: results of different accelerators "
                    "are not comparable (pass --across-accelerators to see them side by side anyway)"
                )
            print(f"WARNING: comparing {safe(a.accel)} (run {a.id}) with {safe(b.accel)} (run {b.id}): "
                  "the difference is mostly the accelerator, not the configuration", file=sys.stderr)
        if "net" in (a.kind, b.kind):
            if args.metric:
                raise InputError("--metric", "network runs are compared on seed 002's four figures; --metric "
                                 "applies to storage runs")
            return _compare_net(st, a, b, args)
        if args.html:
            raise KvmtuneError("--html draws seed 002's network chart; for storage runs use 'kvmtune report RUN… --html FILE'")
        diffs = compare_cells(st.cells(a.id), st.cells(b.id), metrics, args.threshold)
    found = Exit.OK if diffs else Exit.FINDINGS
    if args.format == "json":
        # schema 2: each side's centre is its median over rounds; diff_pct and ci95_pct come from the ratio of
        # geometric means and Welch's interval on the logarithms (never below -100 %)
        return Outcome(found, json.dumps({"schema_version": 2, "run_a": a.id, "run_b": b.id, "diffs": [
            {"configuration": d.key.split("|")[0], "workload": d.key.split("|")[-1], "metric": d.metric,
             "n_a": d.n_a, "n_b": d.n_b, "median_a": d.mean_a, "median_b": d.mean_b, "diff_pct": d.diff_pct,
             "ci95_pct": list(d.ci_pct) if d.ci_pct else None, "better": d.better} for d in diffs]}, indent=2) + "\n")
    if not diffs:
        return Outcome(found, f"runs {a.id} and {b.id} have no configuration × workload in common\n")
    lines = [f"B = run {b.id} against A = run {a.id}; A and B: median over rounds; change: ratio of geometric means "
             f"with its 95 % interval on the log scale; positive = B larger; a verdict only when the whole interval "
             f"lies beyond ±{args.threshold:g} % (B better / A better) or inside it (no measurable effect)"]
    for d in diffs:
        verdict = {"A": "A better", "B": "B better", "same": NO_EFFECT, "differs": "different (no better direction)",
                   "inconclusive": f"{INCONCLUSIVE} (the interval crosses ±{args.threshold:g} %)",
                   "unknown": f"{INCONCLUSIVE} (no interval: 1 round a side, or a zero)"}[d.better]
        lines.append(f"{safe(d.key.split('|')[0]):45} {safe(d.key.split('|')[-1]):24} {d.metric:20} "
                     f"A {d.mean_a:>12,.1f} (n={d.n_a})  B {d.mean_b:>12,.1f} (n={d.n_b})  "
                     f"{d.describe()}  {verdict}")
    return Outcome(found, "".join(f"{line}\n" for line in lines))


def _metrics(given: list[str] | None) -> list[str]:
    """``--metric`` values, each checked against the metrics catalogue."""
    names = [m.strip() for v in (given or []) for m in v.split(",") if m.strip()] or list(DEFAULT_METRICS)
    for name in names:
        if lookup(name) is None:
            raise InputError("--metric", f"unknown metric {name!r}; valid metrics: {', '.join(catalogue_names())}")
    return names


def _compare_net(st: Store, a: Any, b: Any, args: argparse.Namespace) -> Outcome:
    """Network runs differ in configuration by design: match tests by name (seed 002's charts)."""
    from kvmtune.bench.net.chart import BARS, seed002_rows, text_table
    from kvmtune.bench.report import CSS
    from kvmtune.bench.report_net import compare_page
    from kvmtune.fix.files import write_output

    if a.kind != b.kind:
        raise KvmtuneError(f"run {a.id} is a {a.kind} run and run {b.id} a {b.kind} run: nothing to compare")
    for run in (a, b):
        topologies = sorted({str(c.config.get("topology")) for c in st.cells(run.id) if "topology" in c.config})
        if len(topologies) > 1:
            raise KvmtuneError(
                f"run {run.id} measured {', '.join(topologies)} side by side: their comparison is "
                f"'kvmtune report {run.id}'; compare takes runs of one topology each"
            )
    tool_a, tool_b = a.env.get("netload"), b.env.get("netload")
    if tool_a and tool_b and tool_a != tool_b:
        # a workload's definition or the instrument's own cost can change between versions (netload 0.2.0
        # streams with Nagle on, 0.1.0 with tcp_nodelay; 0.4.0's stream receivers wake less often), so the
        # difference may be the tool's
        print(f"WARNING: run {a.id} was measured with {safe(tool_a)} and run {b.id} with {safe(tool_b)}: the workloads "
              "may be defined or measured differently (see netload's README, 'Built-in workloads' and "
              "'Performance notes')", file=sys.stderr)
    rows = seed002_rows(st.cells(a.id), st.cells(b.id))
    if rows and args.html:  # the file before stdout: a reader that closes the pipe early must not cost it
        page = compare_page(a, b, st.cells(a.id), st.cells(b.id), rows, CSS)
        try:
            write_output(args.html, lambda fh: fh.write(page), tag="compare")
        except OSError as exc:
            raise KvmtuneError(f"{args.html}: cannot write ({exc.strerror})") from None
    found = Exit.OK if rows else Exit.FINDINGS
    if args.format == "json":  # one entry per test: seed 002's four figures (+ = B better) and both sides' numbers
        return Outcome(found, json.dumps({"schema_version": 1, "run_a": a.id, "run_b": b.id, "kind": "network", "tests": [
            {"test": r.test, "pct_better": {label: r.pct[label] for label, _ in BARS}, "a": r.a, "b": r.b}
            for r in rows]}, indent=2) + "\n")
    if not rows:
        return Outcome(found, f"runs {a.id} and {b.id} have no successful test in common\n")
    # test names come from the database: each escaped on its own, so none can end a line of the table
    text = (f"B = run {b.id} against A = run {a.id}; % difference, positive = B better "
            "(time and CPU per MB compared as rates)\n"
            + text_table([dataclasses.replace(r, test=safe(r.test)) for r in rows]) + "\n")
    return Outcome(found, text + (f"wrote {args.html}\n" if args.html else ""))
