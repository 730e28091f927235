"""``kvmtune bench net``: seed 002's network tests between probe-guest pairs.

Registered under ``kvmtune bench`` by :mod:`kvmtune.cli.bench`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvmtune.bench.guest import ExtraFile
from kvmtune.bench.net.catalog import MATRICES, parse_tunings, select_tests
from kvmtune.bench.net.netns import require_net_admin
from kvmtune.bench.net.topology import TOPOLOGIES, TopologySpec
from kvmtune.bench.runner import BenchRunner
from kvmtune.bench.store import Store
from kvmtune.bench.workdir import default_db, default_workdir, ensure_dir
from kvmtune.cli.guest import add_guest_options, parse_extra
from kvmtune.errors import InputError
from kvmtune.host.root import HostRoot
from kvmtune.runner import Runner


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
    n.add_argument("--keep-leftovers", action="store_true",
                   help="do not remove what killed runs left (namespaces, loop devices, scratch directories of dead "
                   "owners); only list them")  # fmt: skip
    n.set_defaults(func=run_net_cli)


def run_net_cli(args: argparse.Namespace) -> int:
    """Turn the arguments into a network benchmark and hand it to the benchmark runner."""
    from kvmtune.bench.accel import choose_accel
    from kvmtune.bench.guest import GuestBuilder
    from kvmtune.bench.net.bench import NetBenchmark, NetContext, find_netload

    if args.duration <= 0 or args.memory < 384 or args.smp < 1:
        # the probe guest's initramfs (fio, netload, modules) unpacks to ~100 MB in guest RAM
        raise InputError("--duration/--memory/--smp", "duration must be > 0, memory ≥ 384 MiB, smp ≥ 1")
    if args.ovs_datapath != "auto" and args.topology != "ovs":
        raise InputError("--ovs-datapath", f"does not apply to --topology {args.topology}; it applies to --topology ovs")
    if args.vhost != "auto" and args.topology == "user":
        raise InputError("--vhost", "does not apply to --topology user (QEMU's user-mode network has no vhost-net)")
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
    ctx = NetContext(
        runner=runner, host=host, accel=accel, memory_mb=args.memory, smp=args.smp, boot_timeout_s=args.boot_timeout,
        workdir=workdir, guest=guest, spec=spec, tests=tests, tunings=tunings, duration_s=args.duration,
    )  # fmt: skip
    run_args = {k: v for k, v in vars(args).items() if k != "func"}
    with Store(args.db or default_db()) as store:
        outcome = BenchRunner(store, args=run_args, preset=args.matrix, note=args.note, workdir=workdir,
                              keep_leftovers=args.keep_leftovers, runner=runner).run(NetBenchmark(ctx, netload))  # fmt: skip
    if outcome.status != "partial":
        f = ctx.topology_facts
        print(f"run {outcome.run_id}: {len(outcome.cells) - outcome.failed} cells ok, {outcome.failed} failed, "
              f"{outcome.took_s:.1f}s (topology up {f.get('up_s', 0):.2f}s, down {f.get('down_s', 0):.2f}s)")  # fmt: skip
        for c in outcome.cells:
            if not c.ok:
                print(f"  FAILED pair {c.rep} {c.workload}: {c.error}")
    return outcome.exit_code
