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
from pathlib import Path
from typing import Any

from kvmtune.domain.connection import libvirt_answers
from kvmtune.errors import KvmtuneError
from kvmtune.fix.files import write_output
from kvmtune.host.root import HostRoot
from kvmtune.live.diagnose import Diagnoser, Diagnosis
from kvmtune.live.model import Snapshot
from kvmtune.live.output import prometheus_text, rates_json, render_table
from kvmtune.live.signals import Rates, rates
from kvmtune.live.sources import Sampler
from kvmtune.live.symptoms import thresholds_json
from kvmtune.textsafe import safe

SORT_KEYS = ("guest", "delay", "disk", "net")
DEFAULT_URI = "qemu:///system"
SEED_001_TPS_PER_VM = 5.0
SEED_001_VMS_PER_DISK = 20


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--connect", action="append", default=None, metavar="URI",
                   help=f"libvirt URI to read (repeatable; default {DEFAULT_URI} when it answers)")
    p.add_argument("--no-libvirt", action="store_true", help="read QEMU processes only")
    p.add_argument("--no-processes", action="store_true",
                   help="read libvirt guests only, not the QEMU processes libvirt does not manage")
    p.add_argument("--root", default="/", metavar="DIR", help="read /proc and /sys below DIR")
    p.add_argument("--interval", type=float, default=2.0, metavar="SECONDS")
    p.add_argument("--pid", type=int, action="append", default=None, metavar="PID",
                   help="only these QEMU processes (repeatable); libvirt guests are still read unless --no-libvirt")


def register(sub: Any) -> None:
    p = sub.add_parser("top", help="live view: which running guest is slow, and the rule that explains it",
                       description="Sample every running guest (libvirt's bulk stats, or /proc and QMP for QEMU "
                       "processes libvirt does not manage) and the host, and name the rule behind each slow signal.")
    _common(p)
    p.add_argument("--sort", choices=SORT_KEYS, default="delay")
    p.add_argument("--plain", action="store_true", help="print one table per interval, even on a terminal")
    p.add_argument("--count", type=int, default=0, metavar="N", help="stop after N intervals (0 = until q/Ctrl-C)")
    p.set_defaults(func=run_top)

    s = sub.add_parser("sample", help="sample running guests for a while; JSON or Prometheus textfile output",
                       description="Sample running guests and the host for --duration seconds.")
    _common(s)
    s.add_argument("--duration", type=float, default=60.0, metavar="SECONDS")
    s.add_argument("--format", choices=("text", "json", "prometheus"), default="text")
    s.add_argument("-o", "--output", metavar="FILE", help="write here (atomically) instead of stdout")
    s.set_defaults(func=run_sample)

    c = sub.add_parser("capacity", help="seed 001's sizing: how many such guests each disk carries",
                       description="From the transactions per second each running guest issues (sampled now, "
                       "or read from `kvmtune sample --format json` output) and the disk's capacity in "
                       "transactions per second, say how many such guests one disk carries.")
    _common(c)
    c.add_argument("--disk-tps", type=float, required=True, metavar="TPS",
                   help="what one disk sustains (e.g. from `kvmtune bench storage --tier block`)")
    c.add_argument("--duration", type=float, default=10.0, metavar="SECONDS")
    c.add_argument("--from", dest="from_file", metavar="FILE", help="a `kvmtune sample --format json` file")
    c.add_argument("--format", choices=("text", "json"), default="text")
    c.set_defaults(func=run_capacity)


def _check(args: argparse.Namespace) -> None:
    if not args.interval > 0:
        raise KvmtuneError(f"--interval must be above 0 s, got {args.interval:g}")
    duration = getattr(args, "duration", None)  # sample and capacity; top runs until stopped
    if duration is not None and duration < args.interval:
        raise KvmtuneError(f"--duration ({duration:g} s) must be at least one --interval ({args.interval:g} s)")
    if getattr(args, "disk_tps", 1.0) <= 0:
        raise KvmtuneError(f"--disk-tps must be above 0, got {args.disk_tps:g}")
    if not os.path.isdir(args.root):
        raise KvmtuneError(f"{args.root}: not a directory")


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


def run_top(args: argparse.Namespace) -> int:
    _check(args)
    sampler = _sampler(args)
    try:
        diag = Diagnoser(sampler.host)
        if args.plain or not (sys.stdout.isatty() and sys.stdin.isatty()):
            for r, snap in _intervals(sampler, args.interval, args.count):
                print(render_table(r, diag.diagnose(r, snap), args.sort, width=_width()), flush=True)
            return 0
        return _interactive(sampler, diag, args)
    finally:
        sampler.close()


def _width() -> int:
    with contextlib.suppress(OSError):
        return os.get_terminal_size(sys.stdout.fileno()).columns
    return 160


def _interactive(sampler: Sampler, diag: Diagnoser, args: argparse.Namespace) -> int:
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
    return 0


def _measure(sampler: Sampler, args: argparse.Namespace) -> tuple[list[dict[str, Any]], Rates, list[Diagnosis]]:
    diag = Diagnoser(sampler.host)
    first = sampler.snapshot()
    count = max(1, round(args.duration / args.interval))
    per_interval: list[dict[str, Any]] = []
    last = first
    for r, snap in _intervals(sampler, args.interval, count):
        per_interval.append(rates_json(r, diag.diagnose(r, snap)))
        last = snap
    whole = rates(first, last)
    return per_interval, whole, diag.diagnose(whole, last)


def _write(text: str, output: str | None) -> None:
    if output is None:
        sys.stdout.write(text)
        return
    directory = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(directory):
        raise KvmtuneError(f"{output}: directory {directory} does not exist")
    try:  # node_exporter must never read a half-written textfile
        write_output(Path(output), lambda fh: fh.write(text), tag=f"sample-{os.getpid()}")
    except OSError as exc:
        raise KvmtuneError(f"{output}: cannot write ({exc.strerror})") from None


def run_sample(args: argparse.Namespace) -> int:
    _check(args)
    sampler = _sampler(args)
    try:
        per_interval, whole, diagnoses = _measure(sampler, args)
    finally:
        sampler.close()
    if args.format == "json":
        doc = {"schema_version": 1, "kind": "kvmtune-sample", "duration_s": whole.interval_s,
               "interval_s": args.interval, "thresholds": thresholds_json(),
               "summary": rates_json(whole, diagnoses), "intervals": per_interval}
        _write(json.dumps(doc, indent=2) + "\n", args.output)
    elif args.format == "prometheus":
        _write(prometheus_text(whole, diagnoses), args.output)
    else:
        _write(render_table(whole, diagnoses, "delay", width=_width()) + "\n", args.output)
    return 0


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


def run_capacity(args: argparse.Namespace) -> int:
    _check(args)
    if not args.disk_tps > 0:
        raise KvmtuneError(f"--disk-tps must be above 0, got {args.disk_tps:g}")
    tps, freed = _guest_tps(args)
    busy = [v for v in tps.values() if v > 0]
    mean = sum(busy) / len(busy) if busy else 0.0
    per_disk = int(args.disk_tps // mean) if mean > 0 else None
    out: dict[str, Any] = {
        "guests": tps, "mean_tps_per_guest": mean, **freed, "disk_tps": args.disk_tps, "guests_per_disk": per_disk,
        "seed": f"seed:001 measured about {SEED_001_TPS_PER_VM:g} tps per VM, so about "
                f"{SEED_001_VMS_PER_DISK} VMs on a 100-tps disk",
    }
    if args.format == "json":
        print(json.dumps(out, indent=2))
        return 0
    print(f"{len(tps)} running guest(s); {len(busy)} issued disk transactions while sampled")
    for name, value in sorted(tps.items()):
        print(f"  {safe(name)}: {value:.1f} tps")
    if per_disk is None:
        print("no guest issued disk transactions: nothing to size from (sample while they work)")
    else:
        print(f"mean {mean:.1f} tps per guest: one {args.disk_tps:g}-tps disk carries about {per_disk} such guests")
    print(f"  ({out['seed']})")
    for what, key in (("KSM saves", "ksm_saved_mib"), ("ballooning frees", "balloon_freed_mib")):
        mib = freed[key]
        print(f"{what}: {'not available' if mib is None else f'{mib:.0f} MiB'}")
    return 0
