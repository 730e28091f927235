"""``kvmtune net up|check|list|cleanup``: the benchmark's network topologies by hand.

``up`` builds a topology and holds it until Ctrl-C/SIGTERM (or ``--seconds``),
printing where each guest attaches; ``check`` builds one, wires stand-in
guests to it, pings across it (DF set, full MTU) and tears it down;
``cleanup`` removes whatever a killed run left (namespaces ``kvmtune-*``,
OVS daemons, QEMU and relay processes of dead runs).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

from kvmtune.cli.command import Command, Exit, Outcome
from kvmtune.host.root import HostRoot
from kvmtune.lab.net.cleanup import cleanup, find_leftovers
from kvmtune.lab.net.netns import require_net_admin
from kvmtune.lab.net.topology import TOPOLOGIES, TopologySpec, make_topology
from kvmtune.lab.workdir import default_workdir
from kvmtune.runner import default_runner
from kvmtune.textsafe import safe


def _topology_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", required=True, metavar="|".join(TOPOLOGIES), help="how guests are connected")
    p.add_argument("--pairs", type=int, default=1, help="client/server guest pairs (default 1)")
    p.add_argument("--hosts", type=int, default=1, choices=(1, 2), help="one host namespace or two joined by a veth switch")
    p.add_argument("--mtu", type=int, default=1500, help="MTU set end to end (default 1500)")
    p.add_argument("--txqueuelen", type=int, help="txqueuelen of the tap/macvtap devices")
    p.add_argument("--ovs-datapath", default="auto", choices=("auto", "system", "netdev"))
    p.add_argument("--vhost", default="auto", choices=("auto", "on", "off"))
    p.add_argument("--workdir", type=Path, help="kvmtune work directory (default ~/.cache/kvmtune)")


class NetUpCommand(Command):
    name = "up"
    help = "build a topology and hold it until Ctrl-C"

    def options(self, p: argparse.ArgumentParser) -> None:
        _topology_options(p)
        p.add_argument("--standins", action="store_true", help="attach stand-in guests (namespaces) to every endpoint")
        p.add_argument("--seconds", type=float, default=0,
                       help="tear down after this many seconds (default: wait for Ctrl-C)")

    def run(self, args: argparse.Namespace) -> Outcome:
        return run_up(args)


class NetCheckCommand(Command):
    name = "check"
    help = "build a topology, ping across it with stand-in guests, tear it down"

    def options(self, p: argparse.ArgumentParser) -> None:
        _topology_options(p)
        p.add_argument("--json", action="store_true", help="print the full result as JSON")

    def run(self, args: argparse.Namespace) -> Outcome:
        return run_check(args)


class NetListCommand(Command):
    name = "list"
    help = "show kvmtune namespaces and run directories, live or left over"

    def options(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--workdir", type=Path)

    def run(self, args: argparse.Namespace) -> Outcome:
        return run_list(args)


class NetCleanupCommand(Command):
    name = "cleanup"
    help = "remove what killed runs left (namespaces, OVS, QEMU, relays)"

    def options(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--workdir", type=Path)
        p.add_argument("--force", action="store_true", help="also remove runs whose owner is still running")
        p.add_argument("--dry-run", action="store_true", help="only say what would be removed")

    def run(self, args: argparse.Namespace) -> Outcome:
        return run_cleanup(args)


class NetCommand(Command):
    name = "net"
    help = "build, check and clean up benchmark network topologies"
    subcommands = (NetUpCommand, NetCheckCommand, NetListCommand, NetCleanupCommand)


COMMANDS = (NetCommand,)


def _spec(args: argparse.Namespace) -> TopologySpec:
    spec = TopologySpec(
        args.topology, pairs=args.pairs, hosts=args.hosts, mtu=args.mtu, txqueuelen=args.txqueuelen,
        ovs_datapath=args.ovs_datapath, vhost=args.vhost,
    )
    spec.validate()
    return spec


def _raise_interrupt(_sig: int, _frame: object) -> None:
    raise KeyboardInterrupt


def run_up(args: argparse.Namespace) -> Outcome:
    from kvmtune.lab.net.standin import attach_standin

    spec = _spec(args)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    topo = make_topology(spec, workdir=args.workdir)
    held = False  # once the topology is up, Ctrl-C / SIGTERM is the normal way to end
    try:
        with topo:
            if args.standins:
                for ep in topo.endpoints:
                    attach_standin(topo, ep)
            # held before the announcement: a reader may send Ctrl-C the moment the line arrives,
            # before the statement after the print runs, and that is the normal way to end
            held = True
            print(json.dumps(topo.describe()), flush=True)
            print(f"kvmtune: {spec.kind} topology {topo.runid} is up; Ctrl-C tears it down", file=sys.stderr, flush=True)
            if args.seconds > 0:
                time.sleep(args.seconds)
            else:
                while True:
                    signal.pause()
    except KeyboardInterrupt:
        if not held:
            raise
    print(f"kvmtune: {spec.kind} topology {topo.runid} torn down in {topo.facts.get('down_s', 0):.2f}s", file=sys.stderr)
    return Outcome()


def run_check(args: argparse.Namespace) -> Outcome:
    from kvmtune.lab.net.standin import check_topology

    spec = _spec(args)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    topo = make_topology(spec, workdir=args.workdir)
    with topo:
        result = check_topology(topo)
    result["facts"] = topo.facts
    exit_code = Exit.OK if result["ok"] else Exit.FINDINGS
    if args.json:
        return Outcome(exit_code, json.dumps(result, indent=1) + "\n")
    lines = [f"{'ok  ' if c['passed'] else 'FAIL'} {c['check']}" for c in result["checks"]]
    f = topo.facts
    extra = ", ".join(f"{k}={f[k]}" for k in ("ovs_datapath", "macvtap_lower", "vhost_net") if k in f)
    lines.append(f"{spec.kind}: up {f['up_s']:.3f}s, stand-ins {result['attach_s']:.3f}s, checks {result['check_s']:.3f}s, "
                 f"down {f['down_s']:.3f}s ({extra})")
    return Outcome(exit_code, "".join(f"{line}\n" for line in lines))


def run_list(args: argparse.Namespace) -> Outcome:
    runner, host = default_runner(), HostRoot()
    leftovers = find_leftovers(runner, host, args.workdir or default_workdir())
    lines = []
    for lo in leftovers:
        state = f"live (owner pid {lo.owner_pid})" if lo.live and lo.owner_pid else "live" if lo.live else "left over"
        where = f" {lo.rundir}" if lo.rundir else ""
        lines.append(f"{lo.runid:8} {state:24} {' '.join(lo.namespaces) or '-'}{where}")
    if not leftovers:
        lines.append("no kvmtune network namespaces or run directories")
    return Outcome(result="".join(f"{safe(line)}\n" for line in lines))  # names and paths found on the host


def run_cleanup(args: argparse.Namespace) -> Outcome:
    runner, host = default_runner(), HostRoot()
    require_net_admin(host)
    rep = cleanup(runner, host, args.workdir or default_workdir(), force=args.force, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    lines = [f"{verb} namespace {n}" for n in rep.removed_namespaces]
    lines += [f"{'would stop' if args.dry_run else 'stopped'} process {k}" for k in rep.killed]
    lines += [f"{verb} {d}" for d in rep.removed_dirs]
    lines += [f"skipped {s}: still running (use --force)" for s in rep.skipped_live]
    if rep.nothing_found:
        lines.append("nothing to clean up")
    text = "".join(f"{safe(line)}\n" for line in lines)  # names and paths found on the host
    return Outcome(Exit.FINDINGS if rep.problems else Exit.OK, text, list(rep.problems))
