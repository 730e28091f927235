"""``kvmtune compare RUN_A RUN_B``: differences with their uncertainty."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kvmtune.bench.stats import DEFAULT_METRICS, compare_cells
from kvmtune.bench.store import Store
from kvmtune.bench.workdir import default_db
from kvmtune.errors import KvmtuneError


def register(sub: Any) -> None:
    p = sub.add_parser("compare", help="compare two benchmark runs cell by cell")
    p.add_argument("run_a", type=int, metavar="RUN_A")
    p.add_argument("run_b", type=int, metavar="RUN_B")
    p.add_argument("--db", type=Path, help=f"results database (default {default_db()})")
    p.add_argument("--metric", action="append", help=f"metrics to compare (default {', '.join(DEFAULT_METRICS)})")
    p.add_argument("--threshold", type=float, default=5.0, help="smallest change in %% called a difference (default 5)")
    p.add_argument(
        "--across-accelerators", action="store_true",
        help="allow comparing runs made with different accelerators (the output says so loudly)",
    )  # fmt: skip
    p.add_argument("--html", type=Path, help="network runs: write seed 002's chart (%% difference per test, B against A) here")
    p.set_defaults(func=run_compare)


def run_compare(args: argparse.Namespace) -> int:
    with Store(args.db or default_db(), must_exist=True) as st:
        a, b = st.run(args.run_a), st.run(args.run_b)
        if a.accel != b.accel:
            if not args.across_accelerators:
                raise KvmtuneError(
                    f"run {a.id} used {a.accel} and run {b.id} used {b.accel}: results of different accelerators "
                    "are not comparable (pass --across-accelerators to see them side by side anyway)"
                )
            print(f"WARNING: comparing {a.accel} (run {a.id}) with {b.accel} (run {b.id}): "
                  "the difference is mostly the accelerator, not the configuration", file=sys.stderr)  # fmt: skip
        if "net" in (a.kind, b.kind):
            return _compare_net(st, a, b, args)
        if args.html:
            raise KvmtuneError("--html draws seed 002's network chart; for storage runs use 'kvmtune report RUN… --html FILE'")
        metrics = [m for v in (args.metric or []) for m in v.split(",")] or list(DEFAULT_METRICS)
        diffs = compare_cells(st.cells(a.id), st.cells(b.id), metrics, args.threshold)
        if not diffs:
            print(f"runs {a.id} and {b.id} have no configuration × workload in common")
            return 1
        print(f"B = run {b.id} against A = run {a.id}; positive = B larger; 'better' honours the metric's direction")
        for d in diffs:
            verdict = {"A": "A better", "B": "B better", "same": "no significant difference",
                       "unknown": "direction unknown (1 sample)"}[d.better]  # fmt: skip
            print(f"{d.key.split('|')[0]:45} {d.key.split('|')[-1]:24} {d.metric:20} "
                  f"A {d.mean_a:>12,.1f} (n={d.n_a})  B {d.mean_b:>12,.1f} (n={d.n_b})  {d.describe()}  {verdict}")  # fmt: skip
    return 0


def _compare_net(st: Store, a: Any, b: Any, args: argparse.Namespace) -> int:
    """Network runs differ in configuration by design: match tests by name (seed 002's charts)."""
    from kvmtune.bench.net.chart import compare_net, seed002_html

    if a.kind != b.kind:
        raise KvmtuneError(f"run {a.id} is a {a.kind} run and run {b.id} a {b.kind} run: nothing to compare")
    rows, table = compare_net(st, a, b)
    if not rows:
        print(f"runs {a.id} and {b.id} have no successful test in common")
        return 1
    if args.html:  # the file before stdout: a reader that closes the pipe early must not cost it
        try:
            args.html.write_text(seed002_html(a, b, rows))
        except OSError as exc:
            raise KvmtuneError(f"{args.html}: cannot write ({exc.strerror})") from None
    print(f"B = run {b.id} against A = run {a.id}; % difference, positive = B better "
          "(time and CPU per MB compared as rates)")  # fmt: skip
    print(table)
    if args.html:
        print(f"wrote {args.html}")
    return 0
