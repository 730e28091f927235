"""``kvmtune canary run|baseline``: the drift canary (docs/canary.md)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from kvmtune.cli.command import Command, Exit, Outcome, db_option, format_option, results_db
from kvmtune.errors import KvmtuneError, UsageError
from kvmtune.textsafe import safe


def _pct(x: float) -> str:
    return f"{(x - 1) * 100:+.0f} %"


class CanaryRunCommand(Command):
    name = "run"
    uses_settings = True
    help = "measure the host's virtualization stack and judge the run against the host's baseline"

    def options(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--quick", action="store_true", help="the block and datapath tiers only (at most 30 s)")
        p.add_argument("--dir", type=Path, default=None, metavar="DIR",
                       help="where the scratch replica goes (default: the work directory); the file system of guest images")
        p.add_argument("--workdir", type=Path, default=None, metavar="DIR", help="work directory (default: ~/.cache/kvmtune)")
        p.add_argument("--if-changed", action="store_true",
                       help="run only when the environment changed since the last canary run (packages, kernel, "
                            "settings, limits): for cron and package managers without the apt hook")
        p.add_argument("--baseline-runs", type=int, default=3, metavar="N", help="runs that form the baseline (default 3)")
        p.add_argument("--rounds", type=int, default=3, metavar="N", help=argparse.SUPPRESS)
        p.add_argument("--netload", default=None, metavar="PATH", help="the netload binary (default: found as bench net does)")
        p.add_argument("--busy-load", type=float, default=None, metavar="X",
                       help="not judged when the 1-minute load average before the run exceeds X per CPU (default 1.0)")
        p.add_argument("--busy-spread", type=float, default=None, metavar="X",
                       help="not judged when a metric's log figures vary more than X round to round (default 0.35)")
        # a fixture tree that supplies /var/lib/dpkg/status (tests; read as hostile beneath it)
        p.add_argument("--packages-root", default="/", help=argparse.SUPPRESS)
        db_option(p)
        format_option(p, ("text", "json", "prometheus"),
                      help="prometheus: kvmtune_canary_ratio/_regression gauges for node_exporter's textfile collector")

    def check(self, args: argparse.Namespace) -> None:
        if not 1 <= args.baseline_runs <= 100:
            raise UsageError("--baseline-runs: must be 1..100")
        if not 2 <= args.rounds <= 20:
            raise UsageError("--rounds: must be 2..20")
        if args.dir is not None:
            scratch_directory(args.dir, Path("/"))

    def run(self, args: argparse.Namespace) -> Outcome:
        from kvmtune.canary.environment import DpkgStatusError, cgroup_limits, collect
        from kvmtune.canary.judge import BUSY_LOAD_PER_CPU, BUSY_SPREAD, Busy, judge
        from kvmtune.canary.metrics import JUDGEMENT_KEY, SUITE_VERSION
        from kvmtune.canary.suite import CanaryBenchmark, CanaryPlan
        from kvmtune.host.root import HostRoot
        from kvmtune.lab.leftovers import sweep
        from kvmtune.lab.net.netload import find_netload
        from kvmtune.lab.net.netns import NetError
        from kvmtune.lab.runner import BenchRunner
        from kvmtune.lab.store import Store
        from kvmtune.lab.workdir import default_workdir, ensure_dir
        from kvmtune.runner import Runner

        runner = Runner()
        workdir = ensure_dir(args.workdir or default_workdir(), "work directory")
        scratch_dir = scratch_directory(args.dir, workdir)
        host = HostRoot()
        try:
            netload: str | None = find_netload(args.netload, runner)
        except NetError:
            netload = None
        if scratch_dir != workdir:  # what a killed canary left in --dir (the runner sweeps the work directory)
            line = sweep(runner, HostRoot(), scratch_dir).line()
            if line:
                print(line, file=sys.stderr, flush=True)

        from kvmtune.canary.kvmcost import kvm_module
        from kvmtune.canary.suite import unmeasured

        # the full suite adds the KVM entry cost where /dev/kvm works, and the probe guest's boot to its agent (under
        # TCG where KVM does not boot a guest: labelled, never compared with a KVM figure)
        if args.quick:
            tiers: tuple[str, ...] = ("block", "datapath")
        else:
            tiers = ("block", "probe", "datapath") if kvm_module(host) is None else ("block", "kvm", "probe", "datapath")
        # what this host cannot give is said ("not measured: no /dev/vhost-net"), not left out
        missing = unmeasured(host, tiers, bool(args.quick))

        def environment() -> dict[str, Any]:
            try:
                env = collect(runner, host, str(scratch_dir), packages_root=HostRoot(args.packages_root))
            except DpkgStatusError as exc:
                raise KvmtuneError(str(exc)) from None
            return env | {"tier": "canary", "suite": SUITE_VERSION, "not_measured": missing}
        bench = CanaryBenchmark(runner=runner, host=HostRoot(), scratch_dir=scratch_dir, workdir=workdir, netload=netload,
                                plan_=CanaryPlan(rounds=args.rounds, tiers=tiers), environment_of=environment)
        with Store(results_db(args)) as store:
            if args.if_changed:
                from kvmtune.canary.judge import unchanged_since

                last = unchanged_since(store, environment())
                if last is not None:
                    return Outcome(Exit.OK, f"canary: nothing changed since canary run {last}; not run (--if-changed)\n")
            outcome = BenchRunner(store, args={"suite": SUITE_VERSION, "quick": bool(args.quick)}, workdir=workdir,
                                  runner=runner).run(bench)
            if outcome.status != "complete":
                errors = [f"canary run {outcome.run_id}: {safe(c.workload)}: {safe(c.error)}" for c in outcome.cells if not c.ok]
                return Outcome(Exit.USAGE, None, errors or [f"canary run {outcome.run_id}: {outcome.status}"])
            _limits, after = cgroup_limits(host)
            before = store.run(outcome.run_id).env.get("nr_throttled")
            throttled = after - before if isinstance(after, int) and isinstance(before, int) and after > before else 0
            busy = Busy(BUSY_LOAD_PER_CPU if args.busy_load is None else args.busy_load,
                        BUSY_SPREAD if args.busy_spread is None else args.busy_spread)
            judged = judge(store, store.run(outcome.run_id), args.baseline_runs, throttled, busy)
            store.add_cell(outcome.run_id, JUDGEMENT_KEY, {"verdict": judged.verdict}, "judgement", "ok",
                           {"nr_throttled_during": float(throttled)})
        code = Exit.FINDINGS if judged.verdict == "regression" else Exit.OK
        return Outcome(code, judged)

    def render(self, outcome: Outcome, fmt: str, out: TextIO, *, color: bool) -> None:
        judged = outcome.result
        if judged is None:
            return
        if isinstance(judged, str):
            if fmt == "json":
                out.write(json.dumps({"skipped": judged.strip()}) + "\n")
            elif fmt == "text":
                out.write(judged)
            return
        doc = judged.to_json()  # type: ignore[attr-defined]
        if fmt == "json":
            out.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        elif fmt == "prometheus":
            from kvmtune.canary.history import prometheus_lines

            out.write(prometheus_lines(doc))
        else:
            out.write(render_text(doc))


def render_text(doc: dict[str, Any]) -> str:
    from kvmtune.canary.judge import label_text

    since = f" ({safe(doc['since'])})" if doc.get("since") else ""
    lines = [f"canary run {doc['run']} (suite {doc['suite']}): {doc['verdict']}"
             + (f": host busy: {safe(doc['busy'])}" if doc.get("busy") else "")]
    for m in doc["metrics"]:
        if m["value"] is None:  # not measured on this host: the note says why
            lines.append(f"  {m['verdict']:13} {m['name']}: {safe(m.get('note') or 'not measured')}")
            continue
        figure = f"{m['value']:.4g} {m['unit']}"
        if m["ratio"] is not None and m["interval"] is not None:
            lo, hi = m["interval"]
            figure += f", {_pct(m['ratio'])} [{_pct(lo)}, {_pct(hi)}] against the baseline {m['baseline']:.4g}"
        labels = label_text(m.get("labels") or {})
        note = f"; {safe(m['note'])}" if m.get("note") else ""
        lines.append(f"  {m['verdict']:13} {m['name']}{f' ({labels})' if labels else ''}: {figure}{note}")
    if doc["verdict"] == "regression":
        if doc["changed"]:
            lines.append("  changed since the last run without a regression" + since + ": " + "; ".join(
                f"{safe(c['what'])} {safe(c['before'])} → {safe(c['after'])}" for c in doc["changed"]))
        else:
            lines.append("  nothing in the environment changed since the last run without a regression: load or hardware")
    return "".join(f"{line}\n" for line in lines)


def scratch_directory(given: Path | None, workdir: Path) -> Path:
    """``--dir``: an existing directory named by its real path (one reached through a symbolic link is refused, so
    that the replica lands on the file system the operator named, and the environment names that one)."""
    if given is None:
        return workdir
    absolute = Path(os.path.abspath(given))
    if not absolute.is_dir():
        raise UsageError(f"--dir {safe(str(given))}: not a directory")
    real = Path(os.path.realpath(absolute))
    if real != absolute:
        raise UsageError(f"--dir {safe(str(given))}: goes through a symbolic link (to {safe(str(real))}); "
                         "name the real directory")
    return real


class CanaryBaselineCommand(Command):
    name = "baseline"
    uses_settings = True
    help = "start a new baseline after an intended change (recorded with its reason)"

    def options(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--reset", action="store_true", required=True, help="start a new baseline")
        p.add_argument("--reason", required=True, metavar="TEXT", help="why (recorded)")
        db_option(p)

    def check(self, args: argparse.Namespace) -> None:
        if not args.reason.strip() or len(args.reason) > 500:
            raise UsageError("--reason: one line of 1..500 characters")

    def run(self, args: argparse.Namespace) -> Outcome:
        from kvmtune.canary.metrics import RESET_KIND, SUITE_VERSION
        from kvmtune.lab.store import Store

        with Store(results_db(args)) as store:
            run_id = store.begin_run(RESET_KIND, {"tier": "canary"}, {"suite": SUITE_VERSION, "reason": args.reason})
            store.finish_run(run_id, "complete", note=" ".join(args.reason.split()))
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
        return Outcome(Exit.OK, f"canary baseline reset at {when} (run {run_id}): the next runs form a new baseline\n")


class CanaryHistoryCommand(Command):
    name = "history"
    uses_settings = True
    help = "every canary run and baseline reset: verdict, figures, what changed"

    def options(self, p: argparse.ArgumentParser) -> None:
        db_option(p)
        format_option(p, ("text", "json", "html"), help="html: a chart per metric (runs, the baseline, changes marked)")

    def run(self, args: argparse.Namespace) -> Outcome:
        from kvmtune.canary.history import history
        from kvmtune.lab.store import Store

        with Store(results_db(args), must_exist=True) as store:
            return Outcome(Exit.OK, history(store))

    def render(self, outcome: Outcome, fmt: str, out: TextIO, *, color: bool) -> None:
        from kvmtune.canary.history import render_history

        rows = outcome.result
        assert isinstance(rows, list)
        if fmt == "html":
            from kvmtune.canary.chart import render_html

            out.write(render_html(rows))
            return
        out.write(json.dumps(rows, indent=2) + "\n" if fmt == "json" else render_history(rows))


class CanaryFleetCommand(Command):
    name = "fleet"
    help = "many hosts' canary JSON: hosts with a settled regression, grouped by the change they share"

    def options(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("files", nargs="+", metavar="FILE", help="'kvmtune canary run --format json' output, one per host")
        format_option(p, ("text", "json"))

    def run(self, args: argparse.Namespace) -> Outcome:
        from kvmtune.canary.fleet import group, load

        runs = [load(path) for path in args.files]
        return Outcome(Exit.OK, (group(runs), len(runs)))

    def render(self, outcome: Outcome, fmt: str, out: TextIO, *, color: bool) -> None:
        from kvmtune.canary.fleet import render

        result = outcome.result
        assert isinstance(result, tuple)
        groups, hosts = result
        out.write(json.dumps(groups, indent=2) + "\n" if fmt == "json" else render(groups, hosts))


class CanaryCommand(Command):
    name = "canary"
    help = "drift canary: measure the stack, compare with this host's baseline, name what changed"
    subcommands = (CanaryRunCommand, CanaryBaselineCommand, CanaryHistoryCommand, CanaryFleetCommand)


COMMANDS = (CanaryCommand,)
