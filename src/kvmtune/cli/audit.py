"""``kvmtune audit``: domain XML, libvirt, QEMU command lines (and the host)."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from kvmtune.audit import collect
from kvmtune.audit.collect_agent import DEFAULT_TIMEOUT_S as DEFAULT_AGENT_TIMEOUT_S
from kvmtune.audit.collect_agent import add_guest_insides
from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import AuditResult, run_rules, select_rules
from kvmtune.audit.finding import Severity
from kvmtune.audit.report import FORMATS, render
from kvmtune.audit.report.json_report import write_json
from kvmtune.bench.accel_cache import verdict_for
from kvmtune.cli import audit_host
from kvmtune.errors import UsageError
from kvmtune.fix.files import write_output
from kvmtune.host.root import HostRoot
from kvmtune.textsafe import safe

DEFAULT_URI = "qemu:///system"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def register(sub: Any) -> None:
    p = sub.add_parser("audit", help="audit libvirt domains, QEMU command lines and the host",
                       description="Audit KVM guests against today's best practice. With no input, "
                       "audits what this host runs.")
    p.add_argument("paths", nargs="*", metavar="PATH", help="domain XML files or directories of them")
    p.add_argument("-c", "--connect", action="append", default=[], metavar="URI",
                   help="libvirt URI whose domains to audit (repeatable), e.g. qemu:///system, qemu+ssh://host/system")
    p.add_argument("--qemu-cmdline", action="append", default=[], metavar="FILE",
                   help="a file holding one QEMU command line (repeatable)")
    p.add_argument("--running", action="store_true", help="audit every running qemu-system-* process")
    p.add_argument("--assume-this-host", action="store_true",
                   help="treat guests read from files as guests of this host: compare their vCPUs with this "
                   "host's CPUs and probe their local disk images")
    p.add_argument("--root", default="/", metavar="DIR", help="read /proc, /sys, /etc below DIR (a captured host)")
    p.add_argument("--examples", action="store_true", help="audit the example domains shipped with kvmtune")
    p.add_argument("--format", choices=FORMATS, default="text")
    p.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE (atomically)")
    p.add_argument("--fail-on", metavar="SEVERITY", default=None,
                   help="exit 1 if any finding is at or above SEVERITY (info|low|medium|high|critical)")
    p.add_argument("--only", default="", metavar="RULES", help="comma-separated rule ids, slugs or prefixes")
    p.add_argument("--skip", default="", metavar="RULES", help="comma-separated rule ids, slugs or prefixes")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    p.add_argument("--agent-timeout", type=_seconds, default=DEFAULT_AGENT_TIMEOUT_S, metavar="SECONDS",
                   help="how long each running guest's QEMU guest agent may take to tell its inside "
                   f"(default {DEFAULT_AGENT_TIMEOUT_S:g})")
    p.add_argument("--no-agent", action="store_true",
                   help="do not ask running guests' guest agents about their inside")
    p.set_defaults(func=run)
    audit_host.add_options(p)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 600:
        raise argparse.ArgumentTypeError(f"{text}: give between 0 and 600 seconds")
    return value


def _split(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def gather(args: argparse.Namespace, ctx: AuditContext) -> AuditResult:
    result = AuditResult()
    explicit = bool(args.paths or args.connect or args.qemu_cmdline or args.running or args.examples)
    explicit = explicit or audit_host.named(args)
    if args.paths:
        collect.add_domain_files(args.paths, result)
    for uri in args.connect:
        collect.add_libvirt(uri, result)
    if args.qemu_cmdline:
        collect.add_cmdline_files(args.qemu_cmdline, result)
    if args.running:
        collect.add_running(ctx.host, result)
    if args.examples:
        collect.add_domain_files([str(EXAMPLES)], result)
    audit_host.collect(args, ctx, result, explicit)
    if not explicit:
        found = 0
        if ctx.host.is_live:  # a captured tree's libvirt is not this machine's
            found += collect.add_libvirt(DEFAULT_URI, result, required=False)
        found += collect.add_running(ctx.host, result)
        if not found:
            # Say so rather than audit something else: an operator reads this as the answer about this host.
            result.looked_at.append(f"0 guests on {'this host' if ctx.host.is_live else 'host ' + ctx.host.path}")
            result.hints.append("no guests to audit; 'kvmtune audit --examples' audits the example domains "
                                "shipped with kvmtune")
    collect.mark_guests_off_host(result, getattr(args, "assume_this_host", False))  # verify reuses gather
    if not getattr(args, "no_agent", True):
        add_guest_insides(result, timeout=args.agent_timeout, live_host=ctx.host.is_live)
    audit_host.after_guests(args, ctx, result)
    return result


def run(args: argparse.Namespace) -> int:
    try:
        fail_on = Severity.parse(args.fail_on) if args.fail_on else None
    except ValueError as exc:
        print(f"kvmtune: error: --fail-on: {exc}", file=sys.stderr)
        return 2
    if not os.path.isdir(args.root):
        print(f"kvmtune: error: --root {args.root}: not a directory", file=sys.stderr)
        return 2
    rules = select_rules(_split(args.only), _split(args.skip))
    moved = domain_files_among_images(args)
    ctx = AuditContext(host=(host := HostRoot(args.root)), accel_verdict=verdict_for(host))
    result = gather(args, ctx)
    result.host = ctx.host_label()
    result.looked_at.extend(f"{m}: named after --images but a .xml file, audited as a domain" for m in moved)
    result.findings = run_rules(ctx, result.guests, result.images, result.host_audited, rules)
    result.errors.extend(ctx.errors)
    # NO_COLOR (no-color.org): any non-empty value turns automatic colour off; --color always still wins
    no_color = bool(os.environ.get("NO_COLOR"))
    color = args.color == "always" or (
        args.color == "auto" and not no_color and args.output is None and sys.stdout.isatty())
    audited = bool(result.guests or result.images or result.host_audited)
    # Text mode: an input error is one line on stderr, not also in the report; a run in which every
    # input failed prints no report at all. JSON and SARIF keep the errors inside the document.
    if args.format != "text" or audited or args.output:
        to_terminal = args.output is None and sys.stdout.isatty()
        width = shutil.get_terminal_size().columns if to_terminal else None
        if args.output and args.format == "json":  # streamed: thousands of domains never sit in memory twice
            write_report(Path(args.output), lambda fh: write_json(result, fh))
        elif args.output:
            write_report(Path(args.output), render(result, args.format, color=color, width=width))
        else:
            sys.stdout.write(render(result, args.format, color=color, width=width))
    for err in result.errors:
        print(f"kvmtune: {safe(err)}", file=sys.stderr)
    if result.errors:
        return 2
    if fail_on is not None and any(f.severity >= fail_on for f in result.findings):
        return 1
    return 0



def write_report(path: Path, text: str | Callable[[TextIO], object]) -> None:
    writer = text if callable(text) else (lambda fh: fh.write(text))
    try:
        write_output(path, writer, tag=str(os.getpid()))
    except OSError as exc:
        raise UsageError(f"{path}: cannot write the report ({exc.strerror or exc})") from None


def domain_files_among_images(args: argparse.Namespace) -> list[str]:
    """``--images`` takes every path after it, so ``--images a.qcow2 vm.xml`` would read a domain
    file as a disk image. A ``.xml`` name there is moved to the domain paths; returns those moved."""
    images = list(getattr(args, "images", None) or [])
    moved = [p for p in images if p.lower().endswith(".xml") and not os.path.isdir(p)]
    if moved:
        args.images = [p for p in images if p not in moved]
        args.paths = [*args.paths, *moved]
    return moved
