"""``kvmtune top``, ``sample`` and ``capacity``: why running guests are slow right now.

``top`` refreshes a table every ``--interval`` (``q`` quits, ``s`` changes the sort); without a
terminal it prints one table per interval. ``sample`` measures for ``--duration`` and writes JSON or
node_exporter textfile output. ``capacity`` is seed 001's sizing: guests per disk from the
transactions per second each guest issues.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO

from kvmtune.cli.command import Command, Outcome, format_option, output_option, root_option, settings_of
from kvmtune.domain.connection import libvirt_answers
from kvmtune.errors import KvmtuneError, UsageError
from kvmtune.host.root import HostRoot
from kvmtune.live.diagnose import Diagnoser, Diagnosis
from kvmtune.live.model import Snapshot
from kvmtune.live.output import prometheus_text, rates_json, render_table
from kvmtune.live.signals import Rates, rates
from kvmtune.live.sources import Sampler
from kvmtune.live.symptoms import thresholds_json, with_thresholds
from kvmtune.textsafe import safe

SORT_KEYS = ("guest", "delay", "disk", "net")
DEFAULT_URI = "qemu:///system"
SEED_001_TPS_PER_VM = 5.0
SEED_001_VMS_PER_DISK = 20
DEFAULT_WIDTH = 160  # columns of a terminal that does not say its size (a pipe or file gets whole rows)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--connect", action="append", default=None, metavar="URI",
                   help=f"libvirt URI to read (repeatable; default {DEFAULT_URI} when it answers)")
    p.add_argument("--no-libvirt", action="store_true", help="read QEMU processes only")
    p.add_argument("--no-processes", action="store_true",
                   help="read libvirt guests only, not the QEMU processes libvirt does not manage")
    root_option(p, "read /proc and /sys below DIR")
    p.add_argument("--interval", type=float, default=2.0, metavar="SECONDS")
    p.add_argument("--pid", type=int, action="append", default=None, metavar="PID",
                   help="only these QEMU processes (repeatable); libvirt guests are still read unless --no-libvirt")


def _check(args: argparse.Namespace) -> None:
    if not args.interval > 0:
        raise UsageError(f"--interval must be above 0 s, got {args.interval:g}")
    duration = getattr(args, "duration", None)  # sample and capacity; top runs until stopped
    if duration is not None and duration < args.interval:
        raise UsageError(f"--duration ({duration:g} s) must be at least one --interval ({args.interval:g} s)")
    if getattr(args, "disk_tps", 1.0) <= 0:
        raise UsageError(f"--disk-tps must be above 0, got {args.disk_tps:g}")
    output = getattr(args, "output", None)  # sample: refused before the measuring, not after it
    if output is not None and str(output) != "-":
        directory = os.path.dirname(os.path.abspath(output))
        if not os.path.isdir(directory):
            raise UsageError(f"{output}: directory {directory} does not exist")


class TopCommand(Command):
    name = "top"
    uses_settings = True
    help = "live view: which running guest is slow, and the rule that explains it"
    description = ("Sample every running guest (libvirt's bulk stats, or /proc and QMP for QEMU processes libvirt "
                   "does not manage) and the host, and name the rule behind each slow signal.")

    def options(self, p: argparse.ArgumentParser) -> None:
        _common(p)
        p.add_argument("--sort", choices=SORT_KEYS, default="delay")
        p.add_argument("--plain", action="store_true", help="print one table per interval, even on a terminal")
        p.add_argument("--count", type=int, default=0, metavar="N", help="stop after N intervals (0 = until q/Ctrl-C)")

    def check(self, args: argparse.Namespace) -> None:
        _check(args)

    def run(self, args: argparse.Namespace) -> Outcome:
        sampler = _sampler(args)
        try:
            diag = Diagnoser(sampler.host, settings_of(args).thresholds)
            if args.plain or not (sys.stdout.isatty() and sys.stdin.isatty()):
                for r, snap in _intervals(sampler, args.interval, args.count):  # a stream: each table as it comes
                    print(render_table(r, diag.diagnose(r, snap), args.sort, width=_width()), flush=True)
            else:
                _interactive(sampler, diag, args)
            return Outcome()
        finally:
            sampler.close()


@dataclass
class Sample:
    """What ``sample`` measured: each interval, and the whole duration with its diagnoses."""

    interval_s: float
    per_interval: list[dict[str, Any]]
    whole: Rates
    diagnoses: list[Diagnosis]
    thresholds: dict[str, dict[str, Any]]  # as judged: the settings file's, else the cited defaults


class SampleCommand(Command):
    name = "sample"
    uses_settings = True
    help = "sample running guests for a while; JSON or Prometheus textfile output"
    description = "Sample running guests and the host for --duration seconds."

    def options(self, p: argparse.ArgumentParser) -> None:
        _common(p)
        p.add_argument("--duration", type=float, default=60.0, metavar="SECONDS")
        format_option(p, ("text", "json", "prometheus"))
        output_option(p, "write here (atomically) instead of stdout")

    def check(self, args: argparse.Namespace) -> None:
        _check(args)

    def run(self, args: argparse.Namespace) -> Outcome:
        sampler = _sampler(args)
        try:
            per_interval, whole, diagnoses = _measure(sampler, args)
        finally:
            sampler.close()
        signals = with_thresholds(settings_of(args).thresholds)
        return Outcome(result=Sample(args.interval, per_interval, whole, diagnoses, thresholds_json(signals)))

    def render(self, outcome: Outcome, fmt: str, out: TextIO, *, color: bool) -> None:
        sample = outcome.result
        assert isinstance(sample, Sample)
        if fmt == "json":
            doc = {"schema_version": 1, "kind": "kvmtune-sample", "duration_s": sample.whole.interval_s,
                   "interval_s": sample.interval_s, "thresholds": sample.thresholds,
                   "summary": rates_json(sample.whole, sample.diagnoses), "intervals": sample.per_interval}
            out.write(json.dumps(doc, indent=2) + "\n")
        elif fmt == "prometheus":  # node_exporter never reads a half-written textfile: main writes -o atomically
            out.write(prometheus_text(sample.whole, sample.diagnoses))
        else:
            out.write(render_table(sample.whole, sample.diagnoses, "delay", width=None) + "\n")


class CapacityCommand(Command):
    name = "capacity"
    uses_settings = True
    help = "seed 001's sizing: how many such guests each disk carries"
    description = ("From the transactions per second each running guest issues (sampled now, or read from "
                   "`kvmtune sample --format json` output) and the disk's capacity in transactions per second, say "
                   "how many such guests one disk carries.")

    def options(self, p: argparse.ArgumentParser) -> None:
        _common(p)
        p.add_argument("--disk-tps", type=float, required=True, metavar="TPS",
                       help="what one disk sustains (e.g. from `kvmtune bench storage --tier block`)")
        p.add_argument("--duration", type=float, default=10.0, metavar="SECONDS")
        p.add_argument("--from", dest="from_file", metavar="FILE", help="a `kvmtune sample --format json` file")
        format_option(p, ("text", "json"))

    def check(self, args: argparse.Namespace) -> None:
        _check(args)

    def run(self, args: argparse.Namespace) -> Outcome:
        tps, freed = _guest_tps(args)
        busy = [v for v in tps.values() if v > 0]
        mean = sum(busy) / len(busy) if busy else 0.0
        per_disk = int(args.disk_tps // mean) if mean > 0 else None
        return Outcome(result={
            "guests": tps, "mean_tps_per_guest": mean, **freed, "disk_tps": args.disk_tps, "guests_per_disk": per_disk,
            "seed": f"seed:001 measured about {SEED_001_TPS_PER_VM:g} tps per VM, so about "
                    f"{SEED_001_VMS_PER_DISK} VMs on a 100-tps disk",
        })

    def render(self, outcome: Outcome, fmt: str, out: TextIO, *, color: bool) -> None:
        result = outcome.result
        assert isinstance(result, dict)
        if fmt == "json":
            out.write(json.dumps(result, indent=2) + "\n")
            return
        tps: dict[str, float] = result["guests"]
        per_disk, mean = result["guests_per_disk"], result["mean_tps_per_guest"]
        lines = [f"{len(tps)} running guest(s); {sum(1 for v in tps.values() if v > 0)} issued disk transactions "
                 "while sampled"]
        lines += [f"  {safe(name)}: {value:.1f} tps" for name, value in sorted(tps.items())]
        if per_disk is None:
            lines.append("no guest issued disk transactions: nothing to size from (sample while they work)")
        else:
            lines.append(f"mean {mean:.1f} tps per guest: one {result['disk_tps']:g}-tps disk carries about {per_disk} "
                         "such guests")
        lines.append(f"  ({result['seed']})")
        for what, key in (("KSM saves", "ksm_saved_mib"), ("ballooning frees", "balloon_freed_mib")):
            mib = result[key]
            lines.append(f"{what}: {'not available' if mib is None else f'{mib:.0f} MiB'}")
        out.write("".join(f"{line}\n" for line in lines))


COMMANDS = (TopCommand, SampleCommand, CapacityCommand)


def _sampler(args: argparse.Namespace) -> Sampler:
    host = HostRoot(args.root)
    uris: list[str] = []
    notes: list[str] = []
    if not args.no_libvirt:
        if args.connect:
            uris = list(args.connect)
        elif host.is_live and libvirt_answers(DEFAULT_URI):
            uris = [DEFAULT_URI]
        elif host.is_live:
            notes.append(f"libvirt: not available ({DEFAULT_URI} does not answer); reading QEMU processes only")
    sampler = Sampler(host, uris, processes=not args.no_processes, only_pids=set(args.pid) if args.pid else None)
    sampler.notes[:0] = notes
    return sampler


def _intervals(sampler: Sampler, interval: float, count: int) -> Iterator[tuple[Rates, Snapshot]]:
    prev = sampler.snapshot()
    n = 0
    while count <= 0 or n < count:
        time.sleep(max(0.0, interval - (time.monotonic() - prev.t)))
        cur = sampler.snapshot()
        yield rates(prev, cur), cur
        prev = cur
        n += 1


def _width() -> int | None:
    """The table's width: the terminal's; None (rows never cut) when standard output is a pipe or a file."""
    if not sys.stdout.isatty():
        return None
    with contextlib.suppress(OSError):
        return os.get_terminal_size(sys.stdout.fileno()).columns
    return DEFAULT_WIDTH


def _interactive(sampler: Sampler, diag: Diagnoser, args: argparse.Namespace) -> None:
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    sort = args.sort
    out = sys.stdout
    try:
        tty.setcbreak(fd)
        out.write("\x1b[?1049h\x1b[?25l")  # alternate screen, hide the cursor
        prev = sampler.snapshot()
        out.write("\x1b[H\x1b[2Jkvmtune top: first sample in progress…\n")
        out.flush()
        n = 0
        deadline = prev.t + args.interval
        while args.count <= 0 or n < args.count:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if ready:
                key = os.read(fd, 1).decode(errors="replace")
                if key in ("q", "Q"):
                    break
                if key == "s":
                    sort = SORT_KEYS[(SORT_KEYS.index(sort) + 1) % len(SORT_KEYS)]
                continue
            cur = sampler.snapshot()
            r = rates(prev, cur)
            prev, deadline = cur, cur.t + args.interval
            n += 1
            table = render_table(r, diag.diagnose(r, cur), sort, width=_width())
            out.write("\x1b[H\x1b[2J" + table + f"\n[q] quit  [s] sort: {sort}\n")
            out.flush()
    finally:
        out.write("\x1b[?25h\x1b[?1049l")
        out.flush()
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _measure(sampler: Sampler, args: argparse.Namespace) -> tuple[list[dict[str, Any]], Rates, list[Diagnosis]]:
    diag = Diagnoser(sampler.host, settings_of(args).thresholds)
    first = sampler.snapshot()
    count = max(1, round(args.duration / args.interval))
    per_interval: list[dict[str, Any]] = []
    last = first
    for r, snap in _intervals(sampler, args.interval, count):
        per_interval.append(rates_json(r, diag.diagnose(r, snap)))
        last = snap
    whole = rates(first, last)
    return per_interval, whole, diag.diagnose(whole, last)


def _freed(r: Rates) -> dict[str, float | None]:
    balloons = [g.memory_kib - g.balloon_kib for g in r.guests
                if g.memory_kib is not None and g.balloon_kib is not None]
    return {"ksm_saved_mib": None if r.host.ksm_saved_bytes is None else r.host.ksm_saved_bytes / 2**20,
            "balloon_freed_mib": sum(balloons) / 1024 if balloons else None}


def _guest_tps(args: argparse.Namespace) -> tuple[dict[str, float], dict[str, float | None]]:
    if args.from_file:
        try:
            with open(args.from_file, encoding="utf-8") as fh:
                doc = json.load(fh)
            summary = doc["summary"]
            guests = summary["guests"]
            balloons = [g["memory_kib"] - g["balloon_kib"] for g in guests
                        if g.get("memory_kib") is not None and g.get("balloon_kib") is not None]
            ksm = summary["host"].get("ksm_saved_bytes")
            freed = {"ksm_saved_mib": None if ksm is None else ksm / 2**20,
                     "balloon_freed_mib": sum(balloons) / 1024 if balloons else None}
            return {str(g["name"]): float(g["tps"]) for g in guests}, freed
        except OSError as exc:
            raise KvmtuneError(f"{args.from_file}: cannot read ({exc.strerror})") from None
        except (ValueError, KeyError, TypeError):
            raise KvmtuneError(f"{args.from_file}: not a `kvmtune sample --format json` file") from None
    sampler = _sampler(args)
    try:
        _, whole, _ = _measure(sampler, args)
    finally:
        sampler.close()
    return {g.name: g.tps for g in whole.guests}, _freed(whole)
