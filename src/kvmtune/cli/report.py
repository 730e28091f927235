"""``kvmtune report RUN… --html out.html``: charts and seed verdicts."""

from __future__ import annotations

import argparse
import sys
from datetime import date
from pathlib import Path
from typing import Any

from kvmtune.audit.settings import read_file
from kvmtune.bench.net.claims import winners
from kvmtune.bench.report import baseline_names, render, resolve_baseline, verified_fix_lines
from kvmtune.bench.report_net import claim_rows as net_claim_rows
from kvmtune.bench.verdicts import cell_tier, verdicts
from kvmtune.cli.command import Command, Exit, Outcome, db_option, results_db, settings_of
from kvmtune.errors import KvmtuneError
from kvmtune.fix.files import write_output
from kvmtune.fleet import waivers as fleet_waivers
from kvmtune.fleet.collect import collection_name, read_collection
from kvmtune.fleet.history import History
from kvmtune.fleet.report import build, collection_scope, render_html, render_text
from kvmtune.lab.store import Store
from kvmtune.textsafe import safe


class RunId(int):
    """A ``RUN`` argument: the run id, keeping the text given (among files, ``007`` is a file name)."""

    text: str


def run_or_file(text: str) -> RunId | str:
    """``RUN|FILE``: a run id (all digits) as a number; anything else is an audit JSON file or directory."""
    if not text.isdigit():
        return text
    run_id = RunId(text)
    run_id.text = text
    return run_id


class ReportCommand(Command):
    name = "report"
    help = "HTML report (charts, seed verdicts) of benchmark runs; or a fleet report"
    description = ("RUN ids: charts and seed verdicts of benchmark runs. Audit JSON files or directories of them (one "
                   "per host, e.g. fetched by contrib/ansible): one fleet view. A directory's collection is stored under "
                   "its name and scope, so the next report of that name and scope shows what changed; files named one "
                   "by one are stored only with --save.")
    uses_settings = True  # its --db (results_db) and the waivers of the fleet report come from the settings file too

    def options(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("runs", nargs="+", type=run_or_file, metavar="RUN|FILE")
        p.add_argument("--label", default=None,
                       help="fleet reports: the collection's name (default: the fleet directory's, which contrib/ansible "
                       "sets to the inventory's, else the directory's path); only collections of one name and scope "
                       "are compared")
        save = p.add_mutually_exclusive_group()
        save.add_argument("--save", action="store_true", help="fleet reports: store this collection (files named one "
                          "by one are not stored without it)")
        save.add_argument("--no-save", action="store_true", help="fleet reports: do not store this collection")
        p.add_argument("--waivers", metavar="FILE", default=None,
                       help="fleet reports: a fleet-wide waiver file ([[waiver]] tables as in the settings file), applied "
                       "to every host beside the settings file's waivers")
        p.add_argument("--html", type=Path, help="write the HTML report here")
        p.add_argument("--baseline", metavar="CONFIG",
                       help="benchmark reports: show each bar as %% of this configuration (a name as kvmtune prints it, "
                            "e.g. nbd/raw-off/none/native or 'ovs (userspace) MTU 1500', or the start of exactly one)")
        db_option(p)

    def run(self, args: argparse.Namespace) -> Outcome:
        run_ids = [int(r) for r in args.runs if isinstance(r, RunId)]
        if len(run_ids) != len(args.runs):  # a file among them: every argument is a file (one may be named 7)
            return run_fleet_report(args, [r.text if isinstance(r, RunId) else r for r in args.runs])
        return run_report(args, run_ids)


COMMANDS = (ReportCommand,)


def run_report(args: argparse.Namespace, run_ids: list[int]) -> Outcome:
    head: list[str] = []
    lines: list[str] = []
    with Store(results_db(args), must_exist=True) as st:
        by_accel: dict[str, list[Any]] = {}
        runs = {rid: st.run(rid) for rid in run_ids}  # each run read once
        baseline = resolve_baseline(args.baseline, baseline_names(st, run_ids)) if args.baseline else None
        for rid in run_ids:
            run = runs[rid]
            if run.kind == "verify":
                continue
            for c in st.cells(run.id):
                if c.status == "interrupted":
                    continue
                by_accel.setdefault(c.accel or run.accel or "unknown", []).append(c)
        verify_runs = [runs[rid] for rid in run_ids if runs[rid].kind == "verify"]
        if verify_runs:
            head.append("verified fixes:")
            for run in verify_runs:
                for line in verified_fix_lines(st.cells(run.id)):
                    head.append(f"  run {run.id}: {safe(line)}")  # targets are domain names, changes and errors stored text
        # the HTML report puts verified fixes in its summary (bench.report.render)
        for accel, cells in sorted(by_accel.items()):
            section = [f"[accelerator {accel}]" if accel not in ("none", "unknown") else
                       "[no guest: " + ", ".join(sorted({_tier_name(c) for c in cells})) + "]"]
            net_cells = [c for c in cells if "topology" in c.config]
            by_tier: dict[str, list[Any]] = {}
            for c in cells:
                if "topology" not in c.config:
                    by_tier.setdefault(cell_tier(c), []).append(c)
            for tier, tier_cells in sorted(by_tier.items()):  # tiers are never mixed in one verdict
                section.extend("  " + v.line(tier) for v in verdicts(tier_cells))
            net_by_tier: dict[str, list[Any]] = {}
            for c in net_cells:  # guest and datapath network runs are never ranked together
                net_by_tier.setdefault(str(c.config.get("tier") or "guest"), []).append(c)
            for tier, tier_cells in sorted(net_by_tier.items()):  # kvmtune bench net runs: seed 002's summary table
                twin = " (macvtap measured as macvlan, its namespace twin)" if tier == "datapath" and any(
                    c.config.get("topology") == "macvtap" for c in tier_cells) else ""
                section.extend(f"  seed:002 [{tier} tier]{twin}: " + line for line in winners(tier_cells))
            section.extend("  " + claim.line(tier) for tier, claim in net_claim_rows(net_cells))
            lines.extend(dict.fromkeys(section))  # the same verdict from the same cells once, never twice
        # The file first: a reader that closes stdout early (`| head -1`) must not cost the report.
        if args.html:
            text = render(st, run_ids, baseline=baseline)
            try:
                write_output(args.html, lambda fh: fh.write(text), tag="report")
            except OSError as exc:
                raise KvmtuneError(f"{args.html}: cannot write ({exc.strerror})") from None
            lines.append(f"wrote {args.html}")
    # every line embeds names and labels read from the database
    return Outcome(result="".join(f"{line}\n" for line in head) + "\n".join(safe(line) for line in lines) + "\n")


def _tier_name(cell: Any) -> str:
    return f"network {cell.config.get('tier') or 'guest'} tier" if "topology" in cell.config else f"{cell_tier(cell)} tier"


def run_fleet_report(args: argparse.Namespace, paths: list[str]) -> Outcome:
    waivers = [*settings_of(args).waivers, *(read_file(args.waivers)[1] if args.waivers else [])]
    label = args.label if args.label is not None else collection_name(paths)
    hosts, errors = read_collection(paths)
    if not hosts:
        for err in errors:
            print(f"kvmtune: {safe(err)}", file=sys.stderr)
        raise KvmtuneError("no host's result could be read")
    notes = fleet_waivers.apply(hosts, waivers, date.today())
    scope = collection_scope(hosts)
    directory = any(Path(p).is_dir() for p in paths)
    save = args.save or (directory and not args.no_save)
    unsaved = "--no-save" if args.no_save else "" if save else "files named one by one: --save keeps them"
    db = results_db(args)
    if not save and not db.is_file():  # a one-off look creates no database
        view = build(hosts, None, [], None, errors, label=label, notes=notes)
    else:
        with History(db) as hist:
            cid = hist.save(hosts, label, scope) if save else None
            view = build(hosts, hist.previous(cid, label, scope), hist.trend(label, scope), cid, errors,
                         label=label, notes=notes)
    view.unsaved = unsaved
    if args.html:
        try:
            write_output(args.html, lambda fh: fh.write(render_html(view)), tag="report")
        except OSError as exc:
            raise KvmtuneError(f"{args.html}: cannot write ({exc.strerror})") from None
    text = render_text(view) + (f"wrote {args.html}\n" if args.html else "")
    return Outcome(Exit.USAGE if errors else Exit.OK, text, [*errors, *notes])
