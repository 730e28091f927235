"""``kvmtune verify``: measure each fix as it is vs as fixed, judge it, keep or undo."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shlex
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from kvmtune.audit.collect import Sources, gather
from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules, select_rules
from kvmtune.cli.command import (
    Command,
    Exit,
    Outcome,
    db_option,
    format_option,
    journal_dir_option,
    results_db,
    root_option,
    settings_of,
)
from kvmtune.errors import KvmtuneError, UsageError
from kvmtune.fix.journal import DEFAULT_DIR, ENV_DIR
from kvmtune.host.root import HostRoot
from kvmtune.host.settings import PROFILES as HOST_PROFILES
from kvmtune.kubevirt.load import is_manifest_name
from kvmtune.lab.accel_cache import verdict_for
from kvmtune.lab.workdir import default_workdir, ensure_dir
from kvmtune.textsafe import safe

if TYPE_CHECKING:
    from kvmtune.verify.engine import VerifyResult
    from kvmtune.verify.experiments import VerifyContext

_SIZE = re.compile(r"^(\d+)([KMGT]?)(i?B)?$", re.I)


def parse_size(text: str) -> int:
    m = _SIZE.match(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 1G, 512M)")
    n = int(m.group(1)) << (10 * " KMGT".index((m.group(2) or " ").upper()))
    if not (64 << 20) <= n <= (1 << 40):
        raise argparse.ArgumentTypeError(f"{text}: the replica size must lie between 64M and 1T")
    return n


def _positive(kind: type, low: float) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{text}: must be at least {low:g}")
        return value

    return parse


class VerifyCommand(Command):
    name = "verify"
    uses_settings = True  # [verify] threshold and budgets, and --db's default: the settings file's db (results_db)
    help = "prove each fix on this host: measure as it is and as fixed, judge, keep or undo"
    description = ("For every fixable finding whose effect can be measured here, measure the setting as it is "
                   "and as the fix would make it (guest disks on scratch replicas of their configuration, network "
                   "settings in kvmtune's own namespaces; host-wide settings only with --apply, through the fix "
                   "journal), and judge the ratio on its 95%% interval. The guest's disks are never opened.")

    def options(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("paths", nargs="*", metavar="PATH", help="domain XML files or directories of them")
        p.add_argument("-c", "--connect", action="append", default=[], metavar="URI", help="libvirt URI (repeatable)")
        p.add_argument("--domain", action="append", default=[], metavar="NAME", help="only this domain (repeatable)")
        p.add_argument("--host", action="store_true", help="also verify this host's findings")
        p.add_argument("--images", nargs="+", default=[], metavar="PATH", help="disk images to audit (read with qemu-img info)")
        p.add_argument("--assume-this-host", action="store_true",
                       help="treat guests read from files as this host's: their local images are read with qemu-img "
                       "info (format, cluster size, preallocation) for the replicas; never written or measured")
        p.add_argument("--examples", action="store_true", help="verify the example domains shipped with kvmtune")
        root_option(p, "host root (a captured or fixture tree)")
        p.add_argument("--only", default="", metavar="RULES", help="comma-separated rule ids, slugs or prefixes")
        p.add_argument("--skip", default="", metavar="RULES", help="comma-separated rule ids, slugs or prefixes")
        p.add_argument("--size", type=parse_size, default=1 << 30, metavar="SIZE",
                       help="size of each scratch replica (default 1G)")
        p.add_argument("--repeat", type=_positive(int, 1), default=3, metavar="N",
                       help="samples per side at least, alternating A/B (default 3)")
        p.add_argument("--finding-budget", type=_positive(float, 1.0), default=None, metavar="SECONDS",
                       help="how long one finding may go on adding A/B rounds until its verdict settles (default: the "
                       "settings file's verify.finding_budget, else 30)")
        p.add_argument("--seconds", type=_positive(float, 0.2), default=1.0, metavar="S",
                       help="measuring time of one sample (default 1)")
        p.add_argument("--threshold", type=_positive(float, 0.0), default=None, metavar="PCT",
                       help="smallest change that counts as helping or hurting, in %% (default: the settings file's "
                       "verify.threshold, else 5)")
        p.add_argument("--budget", type=_positive(float, 1.0), default=None, metavar="SECONDS",
                       help="cap the whole run; what does not fit is listed as skipped (default: the settings file's "
                       "verify.budget, else none)")
        p.add_argument("--apply", action="store_true",
                       help="also measure host-wide fixes: apply through the journal, measure, undo unless it helps")
        p.add_argument("--allow-tcg", action="store_true",
                       help="where KVM does not boot guests, still run the guest tier (bus, controller, IOThread, queue, "
                       "NIC fixes in two probe guests) under TCG emulation: labelled emulation, verdicts not comparable")
        p.add_argument("--guest-kernel", default=None, metavar="PATH",
                       help="the kernel the guest tier's probe guests boot (default: the generic kernel "
                       "scripts/guest-kernel.sh unpacked into /var/cache/kvmtune/guest-kernel, else /boot's newest, as bench)")
        p.add_argument("--guest-modules", default=None, metavar="DIR",
                       help="with --guest-kernel: its module tree, a directory with modules.dep (default "
                       "/lib/modules/RELEASE)")
        p.add_argument("--replay", metavar="FILE",
                       help="measure the block-tier findings of the captured disk with a workload 'kvmtune capture' "
                       "wrote (kvmtune-workload/1) instead of the generic job")
        p.add_argument("--replay-mode", choices=("timed", "fast"), default=None,
                       help="timed (default): at the captured times or rate, judged on p99 latency; fast: as fast as "
                       "possible, judged on IOPS")
        p.add_argument("--replay-disk", metavar="TARGET",
                       help="the definition's disk the workload was captured on, when the names differ (default: "
                       "the workload's disk's own name)")
        p.add_argument("--keep", action="store_true", help="with --apply: keep host-wide changes whatever the verdict")
        p.add_argument("-y", "--yes", action="store_true", help="do not ask before changing host-wide settings")
        p.add_argument("--profile", choices=HOST_PROFILES, default="virtual-host", help="host profile the fixes follow")
        journal_dir_option(p, DEFAULT_DIR, ENV_DIR)
        p.add_argument("--workdir", type=Path, default=None, help=f"work directory (default {default_workdir()})")
        db_option(p)
        p.add_argument("--no-store", action="store_true", help="do not write the results database")
        format_option(p, ("text", "json"))

    def check(self, args: argparse.Namespace) -> None:
        if args.domain and not args.connect and not args.paths and not args.examples:
            raise UsageError("--domain needs --connect URI, domain files or --examples")
        if (args.replay_mode or args.replay_disk) and not args.replay:
            raise UsageError("--replay-mode and --replay-disk go with --replay FILE")
        if args.keep and not args.apply:
            raise UsageError("--keep goes with --apply")
        manifests = [p for p in args.paths if is_manifest_name(p)]
        if manifests:
            raise UsageError(f"{manifests[0]}: a KubeVirt manifest; 'kvmtune verify' measures libvirt guests' fixes, "
                             "not manifests yet (docs/kubevirt.md)")
        if args.guest_modules and not args.guest_kernel:
            raise UsageError("--guest-modules goes with --guest-kernel")
        if args.guest_kernel and not Path(args.guest_kernel).is_file():
            raise UsageError(f"--guest-kernel {args.guest_kernel}: no such kernel image")
        if args.guest_modules and not (Path(args.guest_modules) / "modules.dep").is_file():
            raise UsageError(f"--guest-modules {args.guest_modules}: no modules.dep there (run depmod -b for it)")

    def run(self, args: argparse.Namespace) -> Outcome:
        return _verify(args)

    def render(self, outcome: Outcome, fmt: str, out: TextIO, *, color: bool) -> None:
        report = outcome.result
        assert isinstance(report, _Report)
        if fmt == "json":
            doc = {"kvmtune_verify": 1, "elapsed_s": round(report.elapsed, 1), "run": report.run_id,
                   "replay": report.ctx.replay.record() if report.ctx.replay is not None else None,
                   "repeat": report.repeat, "threshold_pct": report.threshold, "seconds_per_sample": report.seconds,
                   "notes": report.ctx.notes, "results": [r.to_json() for r in report.results]}
            out.write(json.dumps(doc, indent=1, default=str) + "\n")
            return
        from kvmtune.verify.engine import render_text

        out.write(render_text(report.results, report.ctx, report.elapsed))
        if report.run_id is not None:
            out.write(f"Stored as run {report.run_id}: 'kvmtune report {report.run_id}' lists it under verified fixes.\n")


COMMANDS = (VerifyCommand,)


@dataclass
class _Report:
    """What ``render`` writes: the verdicts, the context they were measured in, and the stored run."""

    results: list[VerifyResult]
    ctx: VerifyContext
    elapsed: float
    run_id: int | None
    repeat: int
    threshold: float
    seconds: float


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP unwind like Ctrl-C, so every replica, namespace and host change is cleaned up."""

    def raise_interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    old = {s: signal.signal(s, raise_interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@dataclass(frozen=True)
class _Limits:
    threshold: float  # %
    finding_budget: float  # s
    budget: float | None  # s; None: no cap


def _limits(args: argparse.Namespace) -> _Limits:
    """``--threshold``, ``--finding-budget`` and ``--budget`` as given, else the settings file's ``[verify]``."""
    settings = settings_of(args)

    def pick(given: float | None, key: str) -> float | None:
        value = given if given is not None else settings.get(key)
        return None if value is None else float(value)

    threshold, finding_budget = pick(args.threshold, "verify.threshold"), pick(args.finding_budget, "verify.finding_budget")
    assert threshold is not None and finding_budget is not None  # their keys have defaults
    return _Limits(threshold, finding_budget, pick(args.budget, "verify.budget"))


def _inputs_hint(args: argparse.Namespace) -> str:
    """This run's inputs as ``kvmtune verify`` options (for the command a "needs KVM" line names)."""
    parts: list[str] = ["--examples"] if args.examples else []
    parts += [f"--connect {shlex.quote(u)}" for u in args.connect]
    parts += [f"--domain {shlex.quote(d)}" for d in args.domain]
    if args.assume_this_host:
        parts.append("--assume-this-host")
    parts += [shlex.quote(p) for p in args.paths]
    return " ".join(parts)


def _replay(args: argparse.Namespace, runner: Any) -> tuple[Any, str]:
    """The workload file (hostile: capture/workload.py's reader) as a replay, and the definition's disk it is for:
    ``--replay-disk``, else the workload disk's own name."""
    from kvmtune.capture.workload import read_workload
    from kvmtune.lab.storage.replay import build_replay

    doc, digest = read_workload(args.replay)
    targets = [d.get("target") for d in doc["disks"]]
    named = args.replay_disk if args.replay_disk in targets else None
    rep = build_replay(doc, digest, args.replay, mode=args.replay_mode or "timed", disk=named)
    rep.use_fio_of(runner)
    for note in rep.notes:
        print(f"kvmtune: replay: {safe(note)}", file=sys.stderr)
    return rep, args.replay_disk or rep.profile.target


def _split(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _confirm() -> bool:
    if not sys.stdin.isatty():
        raise KvmtuneError("--apply changes host-wide settings and standard input is not a terminal; add --yes")
    sys.stderr.write("verify --apply changes host settings for the time of a measurement (undone unless they help). "
                     "Go on? [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def _verify(args: argparse.Namespace) -> Outcome:
    from kvmtune.lab.probe.kernel import choose_kernel
    from kvmtune.lab.runner import CellSink
    from kvmtune.runner import default_runner
    from kvmtune.verify.engine import VerifyBenchmark, plan_all, subjects
    from kvmtune.verify.experiments import VerifyContext

    if args.apply and not args.yes and not _confirm():
        return Outcome(Exit.FINDINGS, "Aborted; nothing changed.\n")
    started = time.monotonic()
    limits = _limits(args)
    deadline = started + limits.budget if limits.budget else None
    sources = Sources(paths=tuple(args.paths), connect=tuple(args.connect), examples=args.examples, host=args.host,
                      images=tuple(args.images), assume_this_host=args.assume_this_host)
    actx = AuditContext(host=(host := HostRoot(args.root)), accel_verdict=verdict_for(host))
    result = gather(sources, actx)
    guests = result.guests
    if args.domain:
        names = set(args.domain)
        missing = names - {g.name for g in guests}
        if missing:
            return Outcome(Exit.USAGE, errors=[f"error: --domain {', '.join(sorted(missing))}: no such domain among the inputs"])
        guests = [g for g in guests if g.name in names]
    rules = select_rules(_split(args.only), _split(args.skip))
    findings = run_rules(actx, guests, result.images, result.host_audited, rules)
    for err in [*result.errors, *actx.errors]:  # now, not after the measurements: they may take minutes
        print(f"kvmtune: {safe(err)}", file=sys.stderr)
    workdir = ensure_dir(args.workdir or default_workdir(), "work directory")
    kernel = choose_kernel(args.guest_kernel, args.guest_modules)  # the generic kernel unpacked for the guest tier, if any
    ctx = VerifyContext(
        runner=default_runner(), host=actx.host, root=args.root, workdir=workdir, size=args.size, seconds=args.seconds,
        repeat=args.repeat, finding_budget=limits.finding_budget, threshold=limits.threshold, deadline=deadline,
        apply=args.apply, keep=args.keep,
        journal_dir=Path(args.journal_dir) if args.journal_dir else None, profile=args.profile,
        allow_tcg=args.allow_tcg, inputs_hint=_inputs_hint(args),
        guest_kernel=kernel.kernel, guest_modules=kernel.modules_dir,
    )
    if args.replay:
        ctx.replay, ctx.replay_disk = _replay(args, ctx.runner)
    planned = plan_all(subjects(findings, guests, result.images), ctx)
    if ctx.replay is not None and not any(p.experiment is not None and getattr(p.experiment, "replay", None)
                                          for p in planned):
        ctx.notes.append(f"--replay: no block-tier finding on a disk {ctx.replay_disk}: nothing measured with it")
    guest_tier = ctx.guest_accel is not None and any(p.experiment is not None and p.experiment.tier == "guest"
                                                      for p in planned)
    env = {"kvmtune_tiers": "block, netns, host" + (", guest" if guest_tier else ""),
           "accel": ctx.guest_accel.accel if guest_tier and ctx.guest_accel else "none", "root": args.root}
    if ctx.replay is not None:
        env["replay"] = ctx.replay.record()
    bench = VerifyBenchmark(planned, ctx, env)
    run_id = None
    interrupted = False
    if args.no_store or not bench.planned_cells():
        from kvmtune.lab.runner import HostBenchLock

        lock = HostBenchLock()  # every measurement holds the host's one-benchmark lock, stored or not
        if bench.planned_cells():
            lock.acquire()
        try:
            with _terminate_as_interrupt():
                bench.execute(CellSink())
        finally:
            lock.release()
    else:
        from kvmtune.lab.accel import AccelChoice
        from kvmtune.lab.runner import BenchRunner, base_environment
        from kvmtune.lab.store import Store

        choice = ctx.guest_accel if guest_tier and ctx.guest_accel else AccelChoice("none", "verify boots no guest", 0.0)
        env.update(base_environment(ctx.runner, ctx.host, choice, None))
        argv = {**{k: v for k, v in vars(args).items() if k not in ("func", "command_object", "settings")},
                "threshold": limits.threshold, "finding_budget": limits.finding_budget, "budget": limits.budget,
                "db": str(results_db(args))}
        with Store(results_db(args)) as store:
            outcome = BenchRunner(store, args=argv, workdir=workdir, runner=ctx.runner).run(bench)
        run_id, interrupted = outcome.run_id, outcome.status == "partial"
    results = bench.results
    report = _Report(results, ctx, time.monotonic() - started, run_id, args.repeat, limits.threshold, args.seconds)
    if interrupted:
        code = Exit.INTERRUPTED
    elif result.errors or actx.errors:
        code = Exit.USAGE
    else:
        code = Exit.INCOMPLETE if any(r.error for r in results) else Exit.OK
    return Outcome(code, report)
