"""``kvmtune bench storage``: measure the storage matrix on this host."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvmtune.bench.accel import AccelChoice, choose_accel
from kvmtune.bench.runner import Benchmark, BenchRunner, RunOutcome
from kvmtune.bench.storage import fio as fiomod
from kvmtune.bench.storage.bench import MatrixBenchmark, StorageContext, check_user_device
from kvmtune.bench.storage.matrix import (
    AIOS,
    BUSES,
    CACHES,
    FORMATS,
    PREALLOCS,
    PRESETS,
    SCHEDS,
    TARGETS,
    StorageConfig,
    build_matrix,
    preset,
)
from kvmtune.bench.storage.quick import QuickBenchmark, QuickPlan, quick_configs
from kvmtune.bench.storage.snapshot import SnapshotCache
from kvmtune.bench.store import Store
from kvmtune.bench.workdir import Scratch, default_db, default_workdir
from kvmtune.cli.bench_net import register_net
from kvmtune.cli.guest import add_guest_options, build_guest
from kvmtune.errors import InputError
from kvmtune.host.root import HostRoot
from kvmtune.runner import Runner

KEEP_LEFTOVERS_HELP = (
    "do not remove what killed runs left (namespaces, loop devices, scratch directories of dead owners); "
    "only list them"
)


def _csv(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    out: list[str] = []
    for v in values:
        out.extend(x.strip() for x in v.split(",") if x.strip())
    return out


def register(sub: Any) -> None:
    p = sub.add_parser("bench", help="measure storage or the network on this host (probe guests + fio / netload)")
    bs = p.add_subparsers(dest="bench_cmd", metavar="BENCH", parser_class=type(p))
    s = bs.add_parser("storage", help="the storage matrix: bus × cache × aio × format × preallocation × workload")
    add_guest_options(s)
    s.add_argument("--quick", action="store_true", help="qemu-img bench only (no guest): format × prealloc × cache × aio")
    s.add_argument("--preset", choices=PRESETS, help="a seed's matrix (explicit dimension flags override it)")
    s.add_argument("--bus", action="append", help=f"comma list of {', '.join(BUSES)}")
    s.add_argument("--cache", action="append", help=f"comma list of {', '.join(CACHES)}")
    s.add_argument("--aio", action="append", help=f"comma list of {', '.join(AIOS)}")
    s.add_argument("--format", action="append", help=f"comma list of {', '.join(FORMATS)}")
    s.add_argument("--prealloc", action="append", help=f"comma list of {', '.join(PREALLOCS)}")
    s.add_argument("--target", action="append", help=f"comma list of {', '.join(TARGETS)} (default file)")
    s.add_argument("--sched", action="append", help=f"guest I/O scheduler: comma list of {', '.join(SCHEDS)}")
    s.add_argument(
        "--workload", action="append",
        help=f"comma list of workload names ({', '.join(fiomod.BASIC)}, ffsb-OP-tN-MODE, cycle-NNm) or shell globs "
        "that filter a preset's workloads",
    )  # fmt: skip
    s.add_argument("--threads", help="FFSB thread counts (default 1,8,16)")
    s.add_argument("--cycle-mib", type=int, default=64, help="MiB written by the boot-write-shutdown cycle (default 64)")
    s.add_argument("--cycle-idle", type=float, default=3.0, help="seconds the cycle waits for flushes (default 3)")
    s.add_argument("--boot-timeout", type=float, default=60.0, help="seconds a guest may take beyond its workloads")
    s.add_argument("--runtime", type=float, default=5.0, help="seconds per fio workload (default 5)")
    s.add_argument("--disk-size", type=int, default=1024, help="MiB of the disk under test (default 1024)")
    s.add_argument("--repeat", type=int, default=1, help="run the matrix N times (for uncertainty in compare)")
    s.add_argument("--memory", type=int, default=512, help="guest memory in MiB (default 512)")
    s.add_argument("--smp", type=int, default=1, help="guest vCPUs (default 1)")
    s.add_argument("--accel", choices=("auto", "kvm", "tcg"), default="auto", help="auto: use KVM only if a probe boots")
    s.add_argument("--device", help="test this block device (with --destroy-data); it must not be mounted or in use")
    s.add_argument("--destroy-data", action="store_true", help="allow writing over --device")
    s.add_argument(
        "--no-snapshot", action="store_true",
        help="boot the probe guest for every configuration instead of restoring a saved booted one",
    )  # fmt: skip
    s.add_argument("--db", type=Path, help=f"results database (default {default_db()})")
    s.add_argument("--note", help="free text stored with the run")
    s.add_argument("--keep-leftovers", action="store_true", help=KEEP_LEFTOVERS_HELP)
    s.set_defaults(func=run_storage)
    register_net(bs)  # kvmtune bench net (issue 7)
    p.set_defaults(func=lambda _a: (p.print_help(), 2)[1])


def _filter_workloads(workloads: Sequence[fiomod.Workload], patterns: list[str]) -> list[fiomod.Workload]:
    import fnmatch

    out = [w for w in workloads if any(fnmatch.fnmatchcase(w.name, p) for p in patterns)]
    if not out:
        raise InputError("--workload", f"{', '.join(patterns)} matches none of the preset's workloads")
    return out


def run_storage(args: argparse.Namespace) -> int:
    """Turn the arguments into a storage benchmark and hand it to the benchmark runner."""
    if args.runtime <= 0 or args.disk_size < 16 or args.repeat < 1:
        raise InputError("--runtime/--disk-size/--repeat", "runtime must be > 0, disk size ≥ 16 MiB, repeat ≥ 1")
    if args.device and not args.destroy_data:
        raise InputError("--device", f"{args.device}: writing to a block device needs --destroy-data as well")
    runner = Runner()
    host = HostRoot()
    workdir = args.workdir or default_workdir()
    threads = tuple(int(t) for t in args.threads.split(",")) if args.threads else (1, 8, 16)
    guest = None
    configs: list[StorageConfig]
    workloads: list[fiomod.Workload] = []
    if args.quick:
        configs = quick_configs(_csv(args.cache), _csv(args.aio), _csv(args.format), _csv(args.prealloc))
        accel = AccelChoice("none", "qemu-img bench runs no guest", 0.0)
    else:
        if args.preset:
            pr = preset(args.preset, threads, args.cycle_mib, args.cycle_idle)
            dims = dict(pr.dims)
            workloads = list(pr.workloads)
            if args.workload:
                workloads = _filter_workloads(workloads, _csv(args.workload) or [])
        else:
            dims = {}
            workloads = list(fiomod.lookup(_csv(args.workload) or ["randread-4k", "randwrite-4k"]))
        for name in ("bus", "cache", "aio", "format", "prealloc", "target", "sched"):
            given = _csv(getattr(args, name))
            if given:
                dims[name] = tuple(given)
        if args.device:
            dims.setdefault("target", ("device",))
        configs = build_matrix(
            dims.get("bus", ("virtio-blk",)), dims.get("cache", ("none",)), dims.get("aio", ("threads",)),
            dims.get("format", ("raw",)), dims.get("prealloc", ("off",)), dims.get("target", ("file",)),
            dims.get("sched", ("default",)),
        )  # fmt: skip
        if any(c.target == "device" for c in configs) and not args.device:
            raise InputError("--target", "target=device needs --device PATH --destroy-data")
        guest = build_guest(args, runner)
        accel = choose_accel(args.accel, guest, workdir, runner, host)
    user_device = None
    if args.device:
        check_user_device(host, args.device)  # raises when mounted, swapped on, held or busy
        user_device = args.device
    ctx = StorageContext(
        runner=runner, host=host, accel=accel, memory_mb=args.memory, smp=args.smp, boot_timeout_s=args.boot_timeout,
        scratch=Scratch(workdir / f"scratch-{int(time.time() * 1000)}", runner), guest=guest,
        runtime_s=args.runtime, disk_mib=args.disk_size, repeat=args.repeat, user_device=user_device,
    )  # fmt: skip
    if not args.quick and not args.no_snapshot:
        ctx.snapshots = SnapshotCache(workdir / "snapshots", runner)
    bench: Benchmark = (
        QuickBenchmark(ctx, QuickPlan(configs, count=4096)) if args.quick else MatrixBenchmark(ctx, configs, workloads)
    )
    run_args = {k: v for k, v in vars(args).items() if k != "func"}
    try:
        with Store(args.db or default_db()) as store:
            outcome = BenchRunner(store, args=run_args, preset=args.preset, note=args.note, workdir=workdir,
                                  keep_leftovers=args.keep_leftovers, runner=runner).run(bench)  # fmt: skip
    finally:
        ctx.scratch.remove_if_empty()  # a run refused before it started leaves no empty scratch-* behind
    if outcome.status != "partial":
        _summary(outcome, ctx.first_result_s)
        if ctx.snapshots is not None:
            print(f"  {ctx.restored_cells} cells ran in a restored (saved, already booted) guest; "
                  f"{ctx.snapshots.made} guest(s) saved this run")  # fmt: skip
            for reason in sorted(set(ctx.snapshots.failures.values())):
                print(f"  could not save or restore a booted guest (booted instead): {reason}")
    return outcome.exit_code


def _summary(outcome: RunOutcome, first: float | None) -> None:
    bad = [c for c in outcome.cells if not c.ok]
    print(f"run {outcome.run_id}: {len(outcome.cells) - len(bad)} cells ok, {len(bad)} failed, {outcome.took_s:.1f}s"
          + (f"; boot to first fio result {first:.1f}s" if first else ""))  # fmt: skip
    for c in bad:
        print(f"  FAILED {c.config_key} {c.workload}: {c.error}")
