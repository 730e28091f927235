"""``kvmtune report RUN… --html out.html``: charts and seed verdicts."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kvmtune.bench.net.claims import winners
from kvmtune.bench.report import render
from kvmtune.bench.report_net import claim_rows as net_claim_rows
from kvmtune.bench.store import Store
from kvmtune.bench.verdicts import cell_tier, verdicts
from kvmtune.bench.workdir import default_db
from kvmtune.errors import KvmtuneError
from kvmtune.fix.files import write_output
from kvmtune.fleet.collect import read_collection
from kvmtune.fleet.history import History
from kvmtune.fleet.report import build, render_html, render_text
from kvmtune.textsafe import safe


def register(sub: Any) -> None:
    p = sub.add_parser("report", help="HTML report (charts, seed verdicts) of benchmark runs; or a fleet report",
                       description="RUN ids: charts and seed verdicts of benchmark runs. Audit JSON files or "
                       "directories of them (one per host, e.g. fetched by contrib/ansible): one fleet view, "
                       "stored as a collection so the next report shows what changed.")
    p.add_argument("runs", nargs="+", metavar="RUN|FILE")
    p.add_argument("--label", default="", help="fleet reports: a name for this collection")
    p.add_argument("--no-save", action="store_true", help="fleet reports: do not store this collection")
    p.add_argument("--html", type=Path, help="write the HTML report here")
    p.add_argument("--baseline", metavar="CONFIG",
                   help="benchmark reports: show each bar as %% of this configuration (a label on the chart, e.g. none)")
    p.add_argument("--db", type=Path, help=f"results database (default {default_db()})")
    p.set_defaults(func=run_report)


def run_report(args: argparse.Namespace) -> int:
    if not all(a.isdigit() for a in args.runs):
        return run_fleet_report(args)
    args.runs = [int(a) for a in args.runs]
    lines: list[str] = []
    with Store(args.db or default_db(), must_exist=True) as st:
        by_accel: dict[str, list[Any]] = {}
        runs = {rid: st.run(rid) for rid in args.runs}  # each run read once
        for rid in args.runs:
            run = runs[rid]
            if run.kind == "verify":
                continue
            for c in st.cells(run.id):
                if c.status == "interrupted":
                    continue
                by_accel.setdefault(c.accel or run.accel or "unknown", []).append(c)
        verify_runs = [runs[rid] for rid in args.runs if runs[rid].kind == "verify"]
        if verify_runs:

            from kvmtune.verify.engine import verified_fix_lines

            print("verified fixes:")
            for run in verify_runs:
                for line in verified_fix_lines(st.cells(run.id)):
                    print(f"  run {run.id}: {safe(line)}")  # targets are domain names, changes and errors stored text
        # the HTML report puts verified fixes in its summary (bench.report.render)
        for accel, cells in sorted(by_accel.items()):
            lines.append(f"[{accel}]")
            net_cells = [c for c in cells if "topology" in c.config]
            by_tier: dict[str, list[Any]] = {}
            for c in cells:
                if "topology" not in c.config:
                    by_tier.setdefault(cell_tier(c), []).append(c)
            for tier, tier_cells in sorted(by_tier.items()):  # tiers are never mixed in one verdict
                lines.extend("  " + v.line(tier) for v in verdicts(tier_cells))
            net_by_tier: dict[str, list[Any]] = {}
            for c in net_cells:  # guest and datapath network runs are never ranked together
                net_by_tier.setdefault(str(c.config.get("tier") or "guest"), []).append(c)
            for tier, tier_cells in sorted(net_by_tier.items()):  # kvmtune bench net runs: seed 002's summary table
                twin = " (macvtap measured as macvlan, its namespace twin)" if tier == "datapath" and any(
                    c.config.get("topology") == "macvtap" for c in tier_cells) else ""
                lines.extend(f"  seed:002 [{tier} tier]{twin}: " + line for line in winners(tier_cells))
            lines.extend("  " + claim.line(tier) for tier, claim in net_claim_rows(net_cells))
        # The file first: a reader that closes stdout early (`| head -1`) must not cost the report.
        if args.html:
            text = render(st, args.runs, baseline=args.baseline)
            try:
                write_output(args.html, lambda fh: fh.write(text), tag="report")
            except OSError as exc:
                raise KvmtuneError(f"{args.html}: cannot write ({exc.strerror})") from None
            lines.append(f"wrote {args.html}")
    print("\n".join(safe(line) for line in lines))  # every line embeds names and labels read from the database
    return 0


def run_fleet_report(args: argparse.Namespace) -> int:
    hosts, errors = read_collection(args.runs)
    for err in errors:
        print(f"kvmtune: {safe(err)}", file=sys.stderr)
    if not hosts:
        raise KvmtuneError("no host's result could be read")
    with History(args.db or default_db()) as hist:
        cid = None if args.no_save else hist.save(hosts, args.label)
        previous = hist.previous(cid) if cid is not None else hist.previous(10**18)
        view = build(hosts, previous, hist.trend(), cid, errors)
    if args.html:
        try:
            write_output(args.html, lambda fh: fh.write(render_html(view)), tag="report")
        except OSError as exc:
            raise KvmtuneError(f"{args.html}: cannot write ({exc.strerror})") from None
    sys.stdout.write(render_text(view) + (f"wrote {args.html}\n" if args.html else ""))
    return 2 if errors else 0
