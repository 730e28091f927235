"""``kvmtune capture GUEST``: a running guest's disk I/O, recorded from the host into a ``kvmtune-workload/1`` file."""

from __future__ import annotations

import argparse
import datetime
import json
import os
from pathlib import Path
from typing import Any, TextIO

from kvmtune.bench.report_workload import workload_page
from kvmtune.capture.blktrace import BlkTrace
from kvmtune.capture.libvirt import LibvirtGuest
from kvmtune.capture.session import Capture, CaptureResult, restore_leftovers
from kvmtune.capture.workload import SCHEMA, check_workload, from_stats, from_trace, iolog, load_workload, render
from kvmtune.cli.command import Command, Outcome, format_option, root_option
from kvmtune.cli.top import DEFAULT_URI
from kvmtune.domain.connection import libvirt_answers
from kvmtune.errors import KvmtuneError, UsageError
from kvmtune.host.root import HostRoot
from kvmtune.lab.workdir import default_workdir, ensure_dir
from kvmtune.live.sources import Sampler
from kvmtune.live.why import find_target
from kvmtune.runner import Runner
from kvmtune.textsafe import safe


class CaptureCommand(Command):
    name = "capture"
    help = "record a running guest's own disk I/O from the host into a workload file (or --show one)"
    description = (
        "Record one running guest's disk I/O from the host (a libvirt name or UUID, a QEMU pid, or a QEMU -name, found "
        "as 'why' finds it) for --seconds, without touching its data and without a guest agent, and write a "
        f"{SCHEMA} JSON file (-o FILE), with an fio iolog v3 beside it (FILE.iolog) when per-request events were had. "
        "--source trace enables QEMU's virtio-blk trace events over QMP and reads them from QEMU's stderr (the log "
        "backend; -msg timestamp=on for timing; a libvirt guest's QMP through libvirt, which taints it custom-monitor, "
        "and its events from its log /var/log/libvirt/qemu/NAME.log), switching them off at the end, on Ctrl-C and "
        "SIGTERM, and after a SIGKILL at the next capture or doctor; --source blockstats reads query-blockstats at 1 Hz "
        "(mix, mean size, depth by Little's law). This differs from 'capture-host', which copies the files the host audit reads "
        "(/proc, /sys, /etc) into a fixture tree: 'capture' records what a guest does, not what the host is.")

    def options(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("guest", metavar="GUEST", nargs="?", help="libvirt name or UUID, QEMU pid, or QEMU -name")
        p.add_argument("--disk", metavar="NAME", help="only this disk: a libvirt guest's target (vda, sdb), else its "
                                                      "drive id or qdev as query-blockstats names it")
        p.add_argument("--seconds", type=float, default=30.0, metavar="S", help="how long to record (default 30)")
        p.add_argument("--source", choices=("auto", "trace", "blockstats", "blktrace"), default="auto",
                       help="trace: per-request QEMU trace events (with blockstats; on a fast disk they cost the "
                            "guest some of its IOPS: 5-10 %% measured under TCG, about 19 %% for a libvirt guest, "
                            "whose events go through virtlogd, docs/capture.md); blockstats: "
                            "statistics only (one QMP query a second); "
                            "blktrace: the requests of the block device under the disk (blktrace installed, debugfs "
                            "mounted; as the host device saw them); auto: trace where QEMU allows, else blockstats "
                            "(default)")
        p.add_argument("--max-events", type=int, default=2_000_000, metavar="N",
                       help="stop after N requests (default 2000000)")
        p.add_argument("--anonymize", action="store_true", help="shift offsets so the lowest is 0")
        p.add_argument("-o", "--output", dest="workload_file", type=Path, metavar="FILE",
                       help="the workload file to write (FILE.iolog beside it with per-request events)")
        p.add_argument("--show", metavar="FILE", help="print a workload file for a person instead of capturing")
        format_option(p, ("text", "html", "json"),
                      help="with --show: text (default); html, a page drawing each disk's request-size histogram, "
                           "mix and depth; json, the checked file")
        p.add_argument("--workdir", type=Path, help=f"where the capture's marker lives (default {default_workdir()})")
        p.add_argument("--no-libvirt", action="store_true", help="look at QEMU processes only")
        root_option(p, "read /proc below DIR")

    def check(self, args: argparse.Namespace) -> None:
        if args.show is not None:
            return
        if args.format != "text":
            raise UsageError(f"--format {args.format}: only with --show FILE (a capture prints what it wrote)")
        if not args.guest or not args.guest.strip() or any(ord(c) < 32 for c in args.guest):
            raise UsageError("GUEST: empty, or holds control characters (or give --show FILE)")
        if not 1.0 <= args.seconds <= 3600:
            raise UsageError(f"--seconds must be between 1 and 3600, got {args.seconds:g}")
        if not 1 <= args.max_events <= 50_000_000:
            raise UsageError(f"--max-events must be between 1 and 50000000, got {args.max_events}")
        if args.workload_file is None:
            raise UsageError("-o FILE: where to write the workload file")

    def run(self, args: argparse.Namespace) -> Outcome:
        if args.show is not None:
            doc = load_workload(args.show)
            if args.format == "html":
                return Outcome(result=workload_page(doc))
            if args.format == "json":
                return Outcome(result=json.dumps(doc, indent=2, ensure_ascii=True) + "\n")
            return Outcome(result=render(doc))
        host = HostRoot(args.root)
        workdir = ensure_dir(args.workdir or default_workdir(), "work directory")
        restored = restore_leftovers(host, workdir)
        uris = [] if args.no_libvirt or not host.is_live or not libvirt_answers(DEFAULT_URI) else [DEFAULT_URI]
        sampler = Sampler(host, uris)
        try:
            target = find_target(host, sampler.snapshot(), args.guest)
        finally:
            sampler.close()
        if target.pid is None:
            raise KvmtuneError(f"{target.name}: no QEMU pid")
        lv = None
        if target.libvirt:
            if not target.uuid:
                raise KvmtuneError(f"{target.name}: a libvirt guest without a UUID; nothing captured")
            lv = LibvirtGuest(DEFAULT_URI, target.uuid, target.name)
        bt = BlkTrace(host, Runner()) if args.source == "blktrace" else None
        cap = Capture(host, target.pid, workdir, seconds=args.seconds, trace=args.source in ("auto", "trace"),
                      max_events=args.max_events, require_trace=args.source == "trace", libvirt=lv, blktrace=bt)
        result = cap.run()
        result.restored = restored
        if args.source in ("trace", "blktrace") and result.requests is None:
            raise KvmtuneError(f"{target.name}: per-request mode refused: {result.why_not_trace}; "
                               "nothing written (--source blockstats records statistics)")
        doc, log = workload(target.name, result, args.disk, args.anonymize)
        write_files(args.workload_file, doc, log)
        lines = [*restored, f"wrote {args.workload_file}" + (f" and {args.workload_file}.iolog" if log else "")]
        if lv is not None:
            lines.append(f"libvirt domain {target.name}: QMP was reached through libvirt (qemu-monitor-command), "
                         "which marks the domain tainted custom-monitor")
        if result.requests is None and args.source == "auto" and result.why_not_trace:
            lines.append(f"statistics only: {result.why_not_trace}")
        lines += result.notes
        return Outcome(result=render(doc) + "".join(f"{safe(line)}\n" for line in lines))

    def render(self, outcome: Outcome, fmt: str, out: TextIO, *, color: bool) -> None:
        out.write(str(outcome.result))


def workload(guest: str, r: CaptureResult, disk: str | None, anonymize: bool) -> tuple[dict[str, Any], str]:
    names = [n for n in r.stats if disk is None or n == disk]
    if disk is not None and not names:
        raise UsageError(f"--disk {disk}: not one of this guest's disks ({', '.join(sorted(r.stats))})")
    if disk is None and r.requests is None:  # statistics: the disks that did something
        names = [n for n in names if r.stats[n].rd_ops + r.stats[n].wr_ops] or names
    disks, log = [], ""
    for n in names:
        if r.requests is not None:
            reqs = r.requests.get(n, [])
            if not reqs and disk is None:
                continue
            disks.append(from_trace(n, reqs, r.stats[n], anonymize=anonymize, source=r.per_request_source))
            log = log or iolog(n, reqs, anonymize=anonymize)
        else:
            disks.append(from_stats(n, r.stats[n], r.per_second.get(n, [])))
    if not disks:
        raise KvmtuneError(f"{guest}: no disk did any I/O in {r.seconds:.1f} s; nothing written")
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    doc = {"schema": SCHEMA, "guest": guest, "captured_at": now, "disks": disks}
    try:  # what --show (and a replay) will refuse is not written: names and numbers came from others
        check_workload(json.loads(json.dumps(doc)))
    except ValueError as exc:
        raise KvmtuneError(f"{guest}: the workload file would not read back ({exc}); nothing written") from None
    return doc, log


def write_files(path: Path, doc: dict[str, Any], log: str) -> None:
    """The workload file and its iolog, each written whole or not at all: both are written in full beside their
    names first (created new, never through a symbolic link), then renamed over them (a link there is replaced, not
    followed), the iolog first; a capture without one removes an older ``FILE.iolog``, which would otherwise be read
    as this file's."""
    parts: list[tuple[Path, Path]] = []
    try:
        for target, text in ((Path(f"{path}.iolog"), log), (path, json.dumps(doc, indent=2) + "\n")):
            if not text:
                continue
            part = target.with_name(f".{target.name}.part{os.getpid()}")
            parts.append((part, target))
            with open(part, "x", encoding="utf-8") as fh:
                fh.write(text)
        if not log:
            Path(f"{path}.iolog").unlink(missing_ok=True)
        for part, target in parts:
            os.replace(part, target)
    finally:
        for part, _ in parts:
            part.unlink(missing_ok=True)


COMMANDS = (CaptureCommand,)
