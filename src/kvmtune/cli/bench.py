"""``kvmtune bench storage``: measure the storage matrix on this host.

This module turns the arguments into a :class:`~kvmtune.bench.storage.spec.StorageSpec` (which tier, every default
filled in) and hands the tier's benchmark to the runner; the matrix itself is the spec's
(:meth:`~kvmtune.bench.storage.spec.StorageSpec.configs`)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvmtune.bench.storage.block import RAMP_S, BlockBenchmark, BlockPlan
from kvmtune.bench.storage.guest import MatrixBenchmark, StorageContext, check_user_device
from kvmtune.bench.storage.guest import guest_files as storage_guest_files
from kvmtune.bench.storage.hostfs import check_host_fs
from kvmtune.bench.storage.matrix import DIMENSIONS, PRESETS
from kvmtune.bench.storage.quick import QUICK_CAP_S, QuickBenchmark, QuickPlan
from kvmtune.bench.storage.snapshot import SnapshotCache
from kvmtune.bench.storage.spec import GUEST_DEFAULTS, TIERS, StorageSpec, csv_list
from kvmtune.capture.workload import read_workload
from kvmtune.cli.bench_net import BenchNetCommand
from kvmtune.cli.command import Command, Exit, Outcome, db_option, results_db
from kvmtune.cli.guest import add_guest_options, build_guest
from kvmtune.errors import InputError
from kvmtune.host.root import HostRoot
from kvmtune.lab.accel import AccelChoice, choose_accel
from kvmtune.lab.runner import Benchmark, BenchRunner, Cell, RunOutcome
from kvmtune.lab.storage import fio as fiomod
from kvmtune.lab.storage.replay import MODES, Replay, build_replay
from kvmtune.lab.store import CellRow, Store
from kvmtune.lab.workdir import Scratch, default_workdir
from kvmtune.runner import Runner
from kvmtune.textsafe import safe

KEEP_LEFTOVERS_HELP = (
    "do not remove what killed runs left (namespaces, loop devices, scratch directories of dead owners); "
    "only list them"
)


class BenchStorageCommand(Command):
    name = "storage"
    uses_settings = True  # its --db: the settings file's db (results_db)
    help = "the storage matrix: bus × cache × aio × image format × preallocation × workload"

    def options(self, p: argparse.ArgumentParser) -> None:
        add_guest_options(p)
        p.add_argument("--quick", action="store_true",
                       help="qemu-img bench only (no guest): image format × prealloc × cache × aio")
        p.add_argument(
            "--tier", choices=TIERS, default="auto",
            help="guest: fio in a probe guest; block: fio through qemu-storage-daemon over NBD, no guest, next to the "
            "bare-metal floor; auto (default): guest where KVM boots a guest, block where it does not",
        )
        p.add_argument("--ramp", type=float, help=f"block tier: unmeasured seconds before each cell (default {RAMP_S:g})")
        p.add_argument("--preset", choices=PRESETS, help="a seed's matrix (explicit dimension flags override it)")
        for d in DIMENSIONS:  # --bus, --image-format, --prealloc, --cache, --aio, --target, --sched, --host-fs
            default = (f"default {d.default}" if d.field != "aio" else "default: guest tier threads; block tier "
                       "native with cache none or directsync, threads with the others")
            p.add_argument(f"--{d.option}", action="append",
                           help=f"{d.help}: comma list of {', '.join(d.values)} ({default})")
        # the image format's old name, for one release: --format will be the output format, as everywhere else
        p.add_argument("--format", dest="legacy_format", action="append", metavar="FORMAT", help=argparse.SUPPRESS)
        p.add_argument(
            "--workload", action="append",
            help=f"comma list of workload names ({', '.join(fiomod.BASIC)}, ffsb-OP-tN-MODE, cycle-NNm) or shell globs "
            "that filter a preset's workloads",
        )
        p.add_argument("--replay", metavar="FILE",
                       help="block tier: run the matrix with a captured workload ('kvmtune capture', a "
                       "kvmtune-workload/1 file; its FILE.iolog when there, else a job synthesized from its statistics)")
        p.add_argument("--replay-mode", choices=MODES,
                       help="timed (default): at the captured times or rate, judged on latency; fast: as fast as "
                       "possible at the captured depth, judged on throughput")
        p.add_argument("--replay-disk", metavar="TARGET", help="the workload's disk to replay when it has several")
        p.add_argument("--threads", help="FFSB thread counts (default 1,8,16)")
        p.add_argument("--cycle-mib", type=int, help="MiB written by the boot-write-shutdown cycle (default 64)")
        p.add_argument("--cycle-idle", type=float, help="seconds the cycle waits for flushes (default 3)")
        p.add_argument("--boot-timeout", type=float, help="seconds a guest may take beyond its workloads (default 60)")
        p.add_argument("--runtime", type=float, help="seconds per fio workload (default 5); --quick: the time cap per cell")
        p.add_argument("--disk-size", type=int, help="MiB of the disk under test (default 1024)")
        p.add_argument("--repeat", type=int, help="run the matrix N times, interleaved (default 1; block tier 3)")
        p.add_argument("--memory", type=int, help="guest memory in MiB (default 512)")
        p.add_argument("--smp", type=int, help="guest vCPUs (default 1)")
        p.add_argument("--accel", choices=("auto", "kvm", "tcg"), help="auto (default): use KVM only if a probe boots")
        p.add_argument("--device", help="test this block device (with --destroy-data); it must not be mounted or in use")
        p.add_argument("--destroy-data", action="store_true", help="allow writing over --device")
        p.add_argument(
            "--no-snapshot", action="store_true",
            help="boot the probe guest for every configuration instead of restoring a saved booted one",
        )
        db_option(p)
        p.add_argument("--note", help="free text stored with the run")
        p.add_argument("--keep-leftovers", action="store_true", help=KEEP_LEFTOVERS_HELP)

    def run(self, args: argparse.Namespace) -> Outcome:
        if args.legacy_format:
            print("kvmtune: warning: 'bench storage --format' is now --image-format (--format will be the output "
                  "format, as in every other command); the old name is accepted for this release", file=sys.stderr)
        return run_storage(args, storage_spec(args))


class BenchCommand(Command):
    name = "bench"
    help = "measure storage or the network on this host (probe guests + fio / netload)"
    subcommands = (BenchStorageCommand, BenchNetCommand)


COMMANDS = (BenchCommand,)


# options that mean something only to some tiers: (dest, flag, tiers where it applies)
OPTION_TIERS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("bus", "--bus", ("guest",)), ("sched", "--sched", ("guest",)), ("threads", "--threads", ("guest",)),
    ("cycle_mib", "--cycle-mib", ("guest",)), ("cycle_idle", "--cycle-idle", ("guest",)),
    ("boot_timeout", "--boot-timeout", ("guest",)), ("memory", "--memory", ("guest",)), ("smp", "--smp", ("guest",)),
    ("accel", "--accel", ("guest",)), ("no_snapshot", "--no-snapshot", ("guest",)), ("kernel", "--kernel", ("guest",)),
    ("modules_dir", "--modules", ("guest",)), ("extra", "--extra", ("guest",)),
    ("preset", "--preset", ("guest", "block")), ("workload", "--workload", ("guest", "block")),
    ("target", "--target", ("guest", "block")), ("device", "--device", ("guest", "block")),
    ("destroy_data", "--destroy-data", ("guest", "block")),
    ("host_fs", "--host-fs", ("block",)), ("ramp", "--ramp", ("block",)), ("replay", "--replay", ("block",)),
    ("replay_mode", "--replay-mode", ("block",)), ("replay_disk", "--replay-disk", ("block",)),
)


def _given(args: argparse.Namespace, dest: str) -> bool:
    value = getattr(args, dest, None)
    return value not in (None, False, [])


def storage_spec(args: argparse.Namespace) -> StorageSpec:
    """The effective settings of a ``bench storage`` run; a value that cannot be used is an error naming its option."""
    tier = _resolve_tier(args)
    runtime = 5.0 if args.runtime is None else args.runtime
    disk_size = 1024 if args.disk_size is None else args.disk_size
    if runtime <= 0 or disk_size < 16 or (args.repeat is not None and args.repeat < 1):
        raise InputError("--runtime/--disk-size/--repeat", "runtime must be > 0, disk size ≥ 16 MiB, repeat ≥ 1")
    if args.ramp is not None and args.ramp < 0:
        raise InputError("--ramp", "must be ≥ 0 seconds")
    if args.device and not args.destroy_data:
        raise InputError("--device", f"{args.device}: writing to a block device needs --destroy-data as well")
    if args.destroy_data and not args.device:
        raise InputError("--destroy-data", "names no device: give --device PATH as well")
    try:
        threads = tuple(int(t) for t in args.threads.split(",")) if args.threads else (1, 8, 16)
    except ValueError:
        raise InputError("--threads", f"{args.threads!r}: expected a comma list of thread counts, e.g. 1,8,16") from None
    if any(t < 1 for t in threads) or (args.cycle_mib is not None and args.cycle_mib < 1):
        raise InputError("--threads/--cycle-mib", "thread counts and MiB must be ≥ 1")
    dims = {d.field: csv_list(getattr(args, d.option.replace("-", "_"))) for d in DIMENSIONS}
    dims["fmt"] = csv_list([*(args.image_format or []), *(args.legacy_format or [])])
    guest = {dest: default if getattr(args, dest) is None else getattr(args, dest) for dest, default in GUEST_DEFAULTS.items()}
    workloads = csv_list(args.workload)
    replay = None
    if args.replay is not None:
        if workloads is not None or args.preset:
            raise InputError("--replay", "replaces the generic workloads: drop --workload and --preset")
        if args.ramp:
            raise InputError("--ramp", "a replay has no unmeasured ramp: the captured log is measured from its start")
        replay = load_replay(args.replay, args.replay_mode or "timed", args.replay_disk)
        disk_size = replay.replica_mib(16 if args.disk_size is None else disk_size)  # the span, at least the minimum
    elif args.replay_mode or args.replay_disk:
        raise InputError("--replay-mode" if args.replay_mode else "--replay-disk", "needs --replay FILE")
    return StorageSpec(tier=tier, dims=dims, threads=threads, runtime=runtime,
                       quick_cap=QUICK_CAP_S if args.runtime is None else args.runtime, disk_size=disk_size,
                       repeat=args.repeat, cycle_mib=int(guest["cycle_mib"]), cycle_idle=float(guest["cycle_idle"]),
                       boot_timeout=float(guest["boot_timeout"]), memory=int(guest["memory"]), smp=int(guest["smp"]),
                       accel=str(guest["accel"]), preset=args.preset,
                       workloads=None if workloads is None else tuple(workloads), device=args.device,
                       ramp=0.0 if replay is not None else RAMP_S if args.ramp is None else args.ramp, replay=replay)


def load_replay(path: str, mode: str, disk: str | None) -> Replay:
    """A workload file (hostile: capture/workload.py's reader) as a replay; its sha256 is of the bytes read."""
    doc, digest = read_workload(path)
    return build_replay(doc, digest, path, mode=mode, disk=disk)


def _recorded(spec: StorageSpec, args: argparse.Namespace) -> dict[str, Any]:
    """The run's arguments as stored with it: what was given, and the defaults this run used."""
    given = {k: v for k, v in vars(args).items() if k not in ("func", "command_object", "settings")}
    return spec.recorded(given, str(results_db(args)))


def _resolve_tier(args: argparse.Namespace) -> str:
    """quick, guest or block; an option that does not apply to that tier is an error naming where it does."""
    if args.quick:
        if args.tier != "auto":
            raise InputError("--quick", f"is its own tier (qemu-img bench); it cannot be combined with --tier {args.tier}")
        tier = "quick"
    elif args.tier != "auto":
        tier = args.tier
    else:
        guest_only = [flag for dest, flag, tiers in OPTION_TIERS if tiers == ("guest",) and _given(args, dest)]
        block_only = [flag for dest, flag, tiers in OPTION_TIERS if tiers == ("block",) and _given(args, dest)]
        if guest_only and block_only:
            raise InputError(guest_only[0], f"applies to the guest tier, {block_only[0]} to the block tier: choose one")
        tier = "guest" if guest_only else "block" if block_only else "auto"
    for dest, flag, tiers in OPTION_TIERS:
        if tier != "auto" and tier not in tiers and _given(args, dest):
            where = " and ".join(f"the {t} tier" for t in tiers)
            raise InputError(flag, f"does not apply to the {tier} tier{' (--quick)' if tier == 'quick' else ''}; "
                                   f"it applies to {where}")
    return tier


def _auto_tier(args: argparse.Namespace, runner: Runner, host: HostRoot, workdir: Path) -> tuple[str, Any, AccelChoice]:
    """guest where KVM really boots a guest (the probe is cached), block where it does not."""
    if not host.exists("/dev/kvm") or not host.access("/dev/kvm", 6):
        return "block", None, AccelChoice("none", "the block tier runs no guest", 0.0)
    guest = build_guest(args, runner, more=storage_guest_files())
    accel = choose_accel("auto", guest, workdir, runner, host)
    if accel.accel != "kvm":
        print("kvmtune: KVM does not boot a guest here: running the block tier (QEMU's block layer without a guest); "
              "--tier guest runs the probe guest under TCG instead", file=sys.stderr)
        return "block", None, AccelChoice("none", "the block tier runs no guest", 0.0)
    return "guest", guest, accel


def run_storage(args: argparse.Namespace, spec: StorageSpec) -> Outcome:
    """Turn the arguments into a storage benchmark of one tier and hand it to the benchmark runner."""
    runner = Runner()
    host = HostRoot()
    workdir = args.workdir or default_workdir()
    guest, accel = None, AccelChoice("none", "no guest in this tier", 0.0)
    tier = spec.tier
    if tier == "auto":
        spec.configs()  # the guest tier's: bad values are errors before any guest is built or probed
        tier, guest, accel = _auto_tier(args, runner, host, workdir)
    spec = spec.for_tier(tier)
    configs, workloads = spec.configs()
    if tier == "guest" and guest is None:
        guest = build_guest(args, runner, more=storage_guest_files())
        accel = choose_accel(spec.accel, guest, workdir, runner, host)
    host_fs = spec.host_fs
    if tier == "block":
        check_host_fs(runner, host, host_fs)  # before any scratch directory exists
    user_device = None
    if args.device:
        check_user_device(host, args.device)  # raises when mounted, swapped on, held or busy
        user_device = args.device
    ctx = StorageContext(
        runner=runner, host=host, accel=accel, memory_mb=spec.memory, smp=spec.smp, boot_timeout_s=spec.boot_timeout,
        scratch=Scratch(workdir / f"scratch-{int(time.time() * 1000)}", runner), guest=guest,
        runtime_s=spec.runtime, disk_mib=spec.disk_size, repeat=spec.repeat or 1, user_device=user_device,
    )
    bench: Benchmark
    if tier == "quick":
        bench = QuickBenchmark(ctx, QuickPlan(configs, count=4096, cap_s=spec.quick_cap))
    elif tier == "block":
        if spec.replay is not None:
            spec.replay.place(ctx.scratch.root)  # the translated log is written there when the run starts
            spec.replay.use_fio_of(runner)
            workloads = [spec.replay.workload(spec.disk_size, spec.runtime)]
            for note in spec.replay.notes:
                print(f"kvmtune: replay: {safe(note)}", file=sys.stderr)
        bench = BlockBenchmark(ctx, BlockPlan(configs, workloads, host_fs, spec.ramp), replay=spec.replay)
    else:
        if not args.no_snapshot:
            ctx.snapshots = SnapshotCache(workdir / "snapshots", runner)
        bench = MatrixBenchmark(ctx, configs, workloads)
    try:
        with Store(results_db(args)) as store:
            outcome = BenchRunner(store, args=_recorded(spec, args), preset=args.preset, note=args.note, workdir=workdir,
                                  keep_leftovers=args.keep_leftovers, runner=runner).run(bench)
    finally:
        ctx.scratch.remove_if_empty()  # a run refused before it started leaves no empty scratch-* behind
    if outcome.status == "partial":
        return Outcome(Exit(outcome.exit_code))
    lines = _summary(outcome, ctx.first_result_s)
    if ctx.snapshots is not None:
        lines.append(f"  {ctx.restored_cells} cells ran in a restored (saved, already booted) guest; "
                     f"{ctx.snapshots.made} guest(s) saved this run")
        lines.extend(f"  could not save or restore a booted guest (booted instead): {reason}"
                     for reason in sorted(set(ctx.snapshots.failures.values())))
    return Outcome(Exit(outcome.exit_code), "".join(f"{line}\n" for line in lines))


def _summary(outcome: RunOutcome, first: float | None) -> list[str]:
    bad = [c for c in outcome.cells if not c.ok]
    lines = [f"run {outcome.run_id}: {len(outcome.cells) - len(bad)} cells ok, {len(bad)} failed, {outcome.took_s:.1f}s"
             + (f"; boot to first fio result {first:.1f}s" if first else "")]
    lines.extend(f"  FAILED {c.config_key} {c.workload}: {safe(c.error)}" for c in bad)
    return lines + median_lines(outcome.cells)


def median_lines(cells: Sequence[Cell] | Sequence[CellRow]) -> list[str]:
    """Each configuration × workload over its rounds: median IOPS [95 % interval], and % of bare metal."""
    from kvmtune.lab.stats import group_metric, summarize

    rows: Any = [c for c in cells if c.status == "ok"]  # a Cell or a stored CellRow: key, status, metrics
    iops, pct = group_metric(rows, "iops"), group_metric(rows, "pct_of_bare_metal")
    if not iops or max(len(v) for v in iops.values()) < 2:
        return []  # one round: the cells' own lines said it all
    out = ["  median over rounds [95% interval]:"]
    for key, values in iops.items():
        config, workload = key.split("|", 1)
        line = f"    {config:45} {workload:16} {summarize(values).text()} IOPS"
        if key in pct and not config.startswith("host/"):
            line += f", {summarize(pct[key]).text()} % of bare metal"
        out.append(line + f" ({len(values)} rounds)")
    return out
