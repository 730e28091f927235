"""``kvmtune bench net``: seed 002's network tests between probe-guest pairs.

Registered under ``kvmtune bench`` by :mod:`kvmtune.cli.bench`.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from kvmtune.bench.guest import ExtraFile
from kvmtune.bench.net.catalog import MATRICES, parse_tunings, select_tests
from kvmtune.bench.net.netns import require_net_admin
from kvmtune.bench.net.topology import TOPOLOGIES, TopologySpec
from kvmtune.bench.store import Store
from kvmtune.bench.workdir import default_db, default_workdir, ensure_dir
from kvmtune.cli.guest import add_guest_options, parse_extra
from kvmtune.errors import InputError
from kvmtune.host.root import HostRoot
from kvmtune.runner import Runner

EXIT_OK, EXIT_CELLS_FAILED, EXIT_INTERRUPTED = 0, 1, 130


def register_net(bs: Any) -> None:
    n = bs.add_parser("net", help="seed 002's network tests between probe-guest pairs over bridge, OVS, macvtap, NAT, user")
    add_guest_options(n)
    n.add_argument("--topology", required=True, metavar="|".join(TOPOLOGIES), help="how the guests are connected")
    n.add_argument("--mtu", type=int, default=1500, help="MTU end to end: guest, tap, bridge/switch (default 1500)")
    n.add_argument("--pairs", type=int, default=1, help="client/server guest pairs running at once (default 1)")
    n.add_argument("--hosts", type=int, default=1, choices=(1, 2), help="1: pairs on one host; 2: clients and servers apart")
    n.add_argument("--tests", action="append", help="comma list of tests, e.g. rr1c-1x1--1,str-readx30k--10")
    n.add_argument("--matrix", choices=tuple(MATRICES), help="a seed's test list (seed-002: 5 workloads × 1/10/50/250 users)")
    n.add_argument("--duration", type=float, default=30.0, help="seconds per test (default 30; seed 002 used 300)")
    n.add_argument("--tune", help="txqueuelen=N,guest.net.ipv4.KEY=V,… (host-wide knobs belong to 'kvmtune fix')")
    n.add_argument("--netload", help="netload binary for the guests (default: on PATH, else netload/bin/netload)")
    n.add_argument("--ovs-datapath", default="auto", choices=("auto", "system", "netdev"))
    n.add_argument("--vhost", default="auto", choices=("auto", "on", "off"))
    n.add_argument("--memory", type=int, default=512, help="guest memory in MiB (default 512)")
    n.add_argument("--smp", type=int, default=1, help="guest vCPUs (default 1)")
    n.add_argument("--accel", choices=("auto", "kvm", "tcg"), default="auto", help="auto: use KVM only if a probe boots")
    n.add_argument("--boot-timeout", type=float, default=120.0, help="seconds a guest may take beyond its tests")
    n.add_argument("--db", type=Path, help=f"results database (default {default_db()})")
    n.add_argument("--note", help="free text stored with the run")
    n.set_defaults(func=run_net_cli)


def _sigterm(_signo: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run_net_cli(args: argparse.Namespace) -> int:
    from kvmtune.bench.accel import choose_accel
    from kvmtune.bench.guest import GuestBuilder
    from kvmtune.bench.net.bench import NetBenchContext, environment, find_netload, run_net

    if args.duration <= 0 or args.memory < 384 or args.smp < 1:
        # the probe guest's initramfs (fio, netload, modules) unpacks to ~100 MB in guest RAM
        raise InputError("--duration/--memory/--smp", "duration must be > 0, memory ≥ 384 MiB, smp ≥ 1")
    spec = TopologySpec(args.topology, pairs=args.pairs, hosts=args.hosts, mtu=args.mtu,
                        ovs_datapath=args.ovs_datapath, vhost=args.vhost)  # fmt: skip
    spec.validate()
    tests = select_tests([t.strip() for v in (args.tests or []) for t in v.split(",") if t.strip()], args.matrix)
    tunings = parse_tunings(args.tune)
    host = HostRoot()
    require_net_admin(host)  # before building anything
    runner = Runner()
    netload = find_netload(args.netload, runner)
    workdir = ensure_dir(args.workdir or default_workdir(), "work directory")
    extra = [*parse_extra(args.extra), ExtraFile(netload, "/usr/bin/netload")]
    guest = GuestBuilder(workdir, runner, kernel=args.kernel, modules_dir=args.modules_dir, extra=extra).build()
    accel = choose_accel(args.accel, guest, workdir, runner, host)
    ctx = NetBenchContext(
        runner, host, workdir, guest, accel, spec, tests, tunings=tunings, duration_s=args.duration,
        memory_mb=args.memory, smp=args.smp, boot_timeout_s=args.boot_timeout,
    )  # fmt: skip
    store = Store(args.db or default_db())
    run_args = {k: v for k, v in vars(args).items() if k != "func"}
    ctx.store, ctx.run_id = store, store.begin_run("net", environment(ctx, netload), run_args, preset=args.matrix)
    total = len(tests) * spec.pairs

    def progress(cell: Any) -> None:
        m = cell.metrics
        what = (f"{m['throughput_Bps'] / 1e6:9.2f} MB/s {m['tps']:10,.0f} tx/s avg {m.get('lat_avg_us', 0):9.1f} µs"
                if cell.status == "ok" else f"ERROR: {cell.error}")  # fmt: skip
        print(f"[{len(ctx.results)}/{total}] pair {cell.pair} {cell.test.name:22} {what}", file=sys.stderr, flush=True)

    ctx.progress = progress
    print(f"kvmtune: run {ctx.run_id}: {spec.kind}, {len(tests)} tests × {spec.pairs} pair(s), {args.duration:g}s each, "
          f"accelerator {accel.accel}, results in {store.path}", file=sys.stderr)  # fmt: skip
    old = signal.signal(signal.SIGTERM, _sigterm)
    started = time.monotonic()
    try:
        failed = run_net(ctx)
    except KeyboardInterrupt:
        store.add_cell(ctx.run_id, "interrupted", {}, "interrupted", "interrupted", error="stopped by the user")
        store.finish_run(ctx.run_id, "partial", note="interrupted")
        store.close()
        print(f"\nkvmtune: interrupted: run {ctx.run_id} marked partial ({len(ctx.results)} cells stored); "
              "namespaces and guests removed", file=sys.stderr)  # fmt: skip
        return EXIT_INTERRUPTED
    except BaseException:
        store.finish_run(ctx.run_id, "failed")
        store.close()
        raise
    finally:
        signal.signal(signal.SIGTERM, old)
    took = time.monotonic() - started
    store.finish_run(ctx.run_id, "complete" if failed == 0 else "errors", note=args.note)
    store.close()
    f = ctx.topology_facts
    print(f"run {ctx.run_id}: {len(ctx.results) - failed} cells ok, {failed} failed, {took:.1f}s "
          f"(topology up {f.get('up_s', 0):.2f}s, down {f.get('down_s', 0):.2f}s)")  # fmt: skip
    for c in ctx.results:
        if c.status != "ok":
            print(f"  FAILED pair {c.pair} {c.test.name}: {c.error}")
    return EXIT_OK if failed == 0 else EXIT_CELLS_FAILED
