"""``kvmtune bench net``: seed 002's network tests between probe-guest pairs.

A subcommand of ``kvmtune bench`` (:mod:`kvmtune.cli.bench` lists it).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvmtune.bench.net.catalog import MATRICES, NetTest, Tunings, parse_tunings, select_tests
from kvmtune.cli.command import Command, Exit, Outcome, db_option, results_db
from kvmtune.cli.guest import add_guest_options, parse_extra
from kvmtune.errors import InputError
from kvmtune.host.root import HostRoot
from kvmtune.lab.net.netns import require_net_admin
from kvmtune.lab.net.topology import TOPOLOGIES, TopologySpec
from kvmtune.lab.runner import BenchRunner
from kvmtune.lab.store import Store
from kvmtune.lab.workdir import default_workdir, ensure_dir
from kvmtune.runner import Runner
from kvmtune.textsafe import safe

NET_TIERS = ("auto", "guest", "datapath")
# options that mean something to the guest tier only (the datapath tier runs no guest): (dest, flag)
GUEST_ONLY = (("kernel", "--kernel"), ("modules_dir", "--modules"), ("extra", "--extra"), ("vhost", "--vhost"),
              ("memory", "--memory"), ("smp", "--smp"), ("accel", "--accel"), ("boot_timeout", "--boot-timeout"))
GUEST_DEFAULTS: dict[str, Any] = {"vhost": "auto", "memory": 512, "smp": 1, "accel": "auto", "boot_timeout": 120.0}


class BenchNetCommand(Command):
    name = "net"
    uses_settings = True  # its --db: the settings file's db (results_db)
    help = ("seed 002's network tests over bridge, OVS, macvtap, NAT, user: between probe-guest pairs (--tier guest) "
            "or netload in namespaces on the host's datapath (--tier datapath)")

    def options(self, p: argparse.ArgumentParser) -> None:
        add_guest_options(p)
        p.add_argument("--tier", choices=NET_TIERS, default="auto",
                       help="guest: probe-guest pairs (QEMU); datapath: netload in namespaces where the guests' taps "
                       "would be, no QEMU; auto: guest where KVM boots a guest, else datapath")
        p.add_argument("--topology", required=True, metavar="|".join(TOPOLOGIES),
                       help="how the endpoints are connected; the datapath tier takes a comma list (interleaved in one run)")
        p.add_argument("--mtu", type=int, default=1500, help="MTU end to end: guest, tap, bridge/switch (default 1500)")
        p.add_argument("--pairs", type=int, default=1, help="client/server pairs running at once (default 1)")
        p.add_argument("--hosts", type=int, default=1, choices=(1, 2),
                       help="1: pairs on one host; 2: clients and servers apart")
        p.add_argument("--tests", action="append", help="comma list of tests, e.g. rr1c-1x1--1,str-readx30k--10")
        p.add_argument("--matrix", choices=tuple(MATRICES),
                       help="a seed's test list (seed-002: 5 workloads × 1/10/50/250 users)")
        p.add_argument("--duration", type=float, help="seconds per test (default 30 with guests, 5 on the datapath tier; "
                       "seed 002 used 300)")
        p.add_argument("--tune", help="txqueuelen=N,guest.net.ipv4.KEY=V,… (host-wide knobs belong to 'kvmtune fix')")
        p.add_argument("--netload", help="netload binary (default: on PATH, else netload/bin/netload)")
        p.add_argument("--ovs-datapath", default="auto", choices=("auto", "system", "netdev"))
        p.add_argument("--vhost", choices=("auto", "on", "off"), help="guest tier: vhost-net (default auto)")
        p.add_argument("--memory", type=int, help="guest tier: guest memory in MiB (default 512)")
        p.add_argument("--smp", type=int, help="guest tier: guest vCPUs (default 1)")
        p.add_argument("--accel", choices=("auto", "kvm", "tcg"),
                       help="guest tier: auto (default) uses KVM only if a probe boots")
        p.add_argument("--boot-timeout", type=float, help="guest tier: seconds a guest may take beyond its tests (default 120)")
        p.add_argument("--no-pin", action="store_true",
                       help="datapath tier: do not pin netload clients to CPU 0 and servers to CPU 1")
        db_option(p)
        p.add_argument("--note", help="free text stored with the run")
        p.add_argument("--keep-leftovers", action="store_true",
                       help="do not remove what killed runs left (namespaces, loop devices, scratch directories of dead "
                       "owners); only list them")

    def run(self, args: argparse.Namespace) -> Outcome:
        return run_net_cli(args)


@dataclass(frozen=True)
class NetSpec:
    """What ``bench net`` runs, with every default filled in (the arguments themselves are never changed);
    ``tier`` is ``auto`` until probing KVM decides it."""

    tier: str
    duration: float
    vhost: str
    memory: int
    smp: int
    accel: str
    boot_timeout: float

    def recorded(self, args: argparse.Namespace) -> dict[str, Any]:
        """The run's arguments as stored with it: what was given, and the defaults this run used."""
        given = {k: v for k, v in vars(args).items() if k not in ("func", "command_object", "settings")}
        return {**given, "db": str(results_db(args)), "tier": self.tier, "duration": self.duration,
                **{k: getattr(self, k) for k in GUEST_DEFAULTS}}


def _given(args: argparse.Namespace, dest: str) -> bool:
    return getattr(args, dest, None) not in (None, False, [])


def resolve_tier(args: argparse.Namespace, topologies: list[str]) -> str:
    """guest, datapath or auto (decided by probing KVM); options of the other tier are refused by name."""
    guest_only = [flag for dest, flag in GUEST_ONLY if _given(args, dest)]
    if args.tier == "auto":
        if "user" in topologies or guest_only:
            tier = "guest"
        elif len(topologies) > 1 or args.no_pin:
            tier = "datapath"
        else:
            tier = "auto"
    else:
        tier = args.tier
    if tier == "datapath":
        if guest_only:
            raise InputError(guest_only[0], "does not apply to the datapath tier (no guest); it applies to --tier guest")
        if "user" in topologies:
            raise InputError("--topology", "user is QEMU's own user-mode network (slirp): without QEMU there is no "
                             "datapath to measure; use --tier guest for it")
    if tier == "guest":
        if args.no_pin:
            raise InputError("--no-pin", "applies to the datapath tier (netload runs on the host there)")
        if len(topologies) > 1:
            raise InputError("--topology", f"{','.join(topologies)}: the guest tier runs one topology per run "
                             "(compare runs with 'kvmtune compare'); the datapath tier takes a list")
    return tier


def _auto_tier(runner: Runner, host: HostRoot, workdir: Path, args: argparse.Namespace, netload: str) -> str:
    """guest where KVM really boots a guest (the probe is cached), datapath where it does not."""
    import sys

    from kvmtune.bench.net.guest import guest_files
    from kvmtune.lab.accel import detect_accel
    from kvmtune.lab.guest import GuestBuilder

    why = "/dev/kvm is absent or not usable by this user"
    if host.exists("/dev/kvm") and host.access("/dev/kvm", 6):
        extra = [*parse_extra(args.extra), *guest_files(netload)]
        guest = GuestBuilder(workdir, runner, kernel=args.kernel, modules_dir=args.modules_dir, extra=extra).build()
        choice = detect_accel(guest, workdir, runner, host)  # cached: the guest tier's probe
        if choice.accel == "kvm":
            return "guest"
        why = choice.reason.split(": ", 1)[0]
    print(f"kvmtune: KVM does not boot a guest here ({why}): running the datapath tier (netload in namespaces on the "
          "host's datapath, no guest); --tier guest runs probe guests under TCG instead", file=sys.stderr)
    return "datapath"


def run_net_cli(args: argparse.Namespace) -> Outcome:
    """Turn the arguments into a network benchmark of one tier and hand it to the benchmark runner."""
    topologies = [t.strip() for t in args.topology.split(",") if t.strip()]
    if not topologies or len(set(topologies)) != len(topologies):
        raise InputError("--topology", f"{args.topology!r}: name each topology once ({', '.join(TOPOLOGIES)})")
    tier = resolve_tier(args, topologies)
    guest = {dest: default if getattr(args, dest) is None else getattr(args, dest) for dest, default in GUEST_DEFAULTS.items()}
    spec = NetSpec(tier=tier, duration=(5.0 if tier == "datapath" else 30.0) if args.duration is None else args.duration,
                   vhost=str(guest["vhost"]), memory=int(guest["memory"]), smp=int(guest["smp"]), accel=str(guest["accel"]),
                   boot_timeout=float(guest["boot_timeout"]))
    if spec.duration <= 0 or spec.memory < 384 or spec.smp < 1:
        # the probe guest's initramfs (fio, netload, modules) unpacks to ~100 MB in guest RAM
        raise InputError("--duration/--memory/--smp", "duration must be > 0, memory ≥ 384 MiB, smp ≥ 1")
    if args.ovs_datapath != "auto" and "ovs" not in topologies:
        raise InputError("--ovs-datapath", f"does not apply to --topology {args.topology}; it applies to --topology ovs")
    if spec.vhost != "auto" and "user" in topologies:
        raise InputError("--vhost", "does not apply to --topology user (QEMU's user-mode network has no vhost-net)")
    specs = []
    for kind in topologies:
        topo = TopologySpec(kind, pairs=args.pairs, hosts=args.hosts, mtu=args.mtu, ovs_datapath=args.ovs_datapath,
                            vhost=spec.vhost, attach="netns" if tier == "datapath" else "tap")
        topo.validate()
        specs.append(topo)
    tests = select_tests([t.strip() for v in (args.tests or []) for t in v.split(",") if t.strip()], args.matrix)
    tunings = parse_tunings(args.tune)
    host = HostRoot()
    require_net_admin(host)  # before building anything
    runner = Runner()
    from kvmtune.lab.net.netload import find_netload

    netload = find_netload(args.netload, runner)
    workdir = ensure_dir(args.workdir or default_workdir(), "work directory")
    if tier == "auto":
        tier = _auto_tier(runner, host, workdir, args, netload)
        spec = dataclasses.replace(spec, tier=tier)
        if tier == "datapath":
            specs = [dataclasses.replace(s, attach="netns") for s in specs]
    if tier == "datapath":
        return _run_datapath(args, spec, runner, host, workdir, specs, tests, tunings, netload)
    return _run_guest(args, spec, runner, host, workdir, specs[0], tests, tunings, netload)


def _store_and_run(args: argparse.Namespace, spec: NetSpec, runner: Runner, workdir: Path, bench: Any) -> Any:
    with Store(results_db(args)) as store:
        return BenchRunner(store, args=spec.recorded(args), preset=args.matrix, note=args.note, workdir=workdir,
                           keep_leftovers=args.keep_leftovers, runner=runner).run(bench)


def _failures(outcome: Any) -> list[str]:
    # the guest tier's error text comes from the guest's console: never raw control characters to a terminal
    return [f"  FAILED {c.config.get('topology', '')} pair {c.rep} {c.workload}: {safe(c.error)}"
            for c in outcome.cells if not c.ok]


def _outcome(outcome: Any, lines: list[str]) -> Outcome:
    return Outcome(Exit(outcome.exit_code), "".join(f"{line}\n" for line in lines))


def _run_datapath(args: argparse.Namespace, spec: NetSpec, runner: Runner, host: HostRoot, workdir: Path,
                  specs: list[TopologySpec], tests: list[NetTest], tunings: Tunings, netload: str) -> Outcome:
    from kvmtune.bench.net.datapath import DatapathBenchmark, DatapathContext

    ctx = DatapathContext(runner=runner, host=host, workdir=workdir, specs=specs, tests=tests, netload=netload,
                          tunings=tunings, duration_s=spec.duration, pin=not args.no_pin)
    bench = DatapathBenchmark(ctx)
    outcome = _store_and_run(args, spec, runner, workdir, bench)
    if outcome.status == "partial":
        return Outcome(Exit(outcome.exit_code))
    over = sorted(bench.overhead_s())
    median = over[len(over) // 2] if over else 0.0
    ups = ", ".join(f"{k} up {f.get('up_s', 0):.2f}s" for k, f in ctx.facts.items())
    lines = [f"run {outcome.run_id} [datapath tier]: {len(outcome.cells) - outcome.failed} cells ok, {outcome.failed} "
             f"failed, {outcome.took_s:.1f}s ({ups}; harness overhead per test median {median:.2f}s)"]
    if "macvtap" in ctx.facts:
        lines.append("  macvtap measured through its namespace twin: a macvlan in bridge mode on the same lower device")
    lines += [*_failures(outcome), f"  seed 002's summary: kvmtune report {outcome.run_id}"]
    return _outcome(outcome, lines)


def _run_guest(args: argparse.Namespace, spec: NetSpec, runner: Runner, host: HostRoot, workdir: Path,
               topology: TopologySpec, tests: list[NetTest], tunings: Tunings, netload: str) -> Outcome:
    from kvmtune.bench.net.guest import NetBenchmark, NetContext, guest_files
    from kvmtune.lab.accel import choose_accel
    from kvmtune.lab.guest import GuestBuilder

    extra = [*parse_extra(args.extra), *guest_files(netload)]
    guest = GuestBuilder(workdir, runner, kernel=args.kernel, modules_dir=args.modules_dir, extra=extra).build()
    accel = choose_accel(spec.accel, guest, workdir, runner, host)
    ctx = NetContext(
        runner=runner, host=host, accel=accel, memory_mb=spec.memory, smp=spec.smp, boot_timeout_s=spec.boot_timeout,
        workdir=workdir, guest=guest, spec=topology, tests=tests, tunings=tunings, duration_s=spec.duration,
    )
    outcome = _store_and_run(args, spec, runner, workdir, NetBenchmark(ctx, netload))
    if outcome.status == "partial":
        return Outcome(Exit(outcome.exit_code))
    f = ctx.topology_facts
    lines = [f"run {outcome.run_id}: {len(outcome.cells) - outcome.failed} cells ok, {outcome.failed} failed, "
             f"{outcome.took_s:.1f}s (topology up {f.get('up_s', 0):.2f}s, down {f.get('down_s', 0):.2f}s)"]
    return _outcome(outcome, lines + _failures(outcome))
