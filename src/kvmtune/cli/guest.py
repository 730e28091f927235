"""``kvmtune guest build`` / ``kvmtune guest accel``: the probe guest and the accelerator it gets."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kvmtune.bench.accel import detect_accel
from kvmtune.bench.guest import ExtraFile, GuestBuilder, ProbeGuest
from kvmtune.bench.workdir import default_workdir, ensure_dir
from kvmtune.errors import InputError
from kvmtune.runner import Runner


def add_guest_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kernel", help="kernel image for the probe guest (default: the newest /boot/vmlinuz-*)")
    p.add_argument("--modules", dest="modules_dir", help="module tree of that kernel (default: /lib/modules/RELEASE)")
    p.add_argument("--workdir", type=Path, help=f"scratch and cache directory (default: {default_workdir()})")
    p.add_argument(
        "--extra",
        action="append",
        default=[],
        metavar="SRC:DEST",
        help="add a host binary to the initramfs at DEST (its libraries too); repeatable",
    )


def parse_extra(values: list[str]) -> list[ExtraFile]:
    out = []
    for v in values:
        if ":" not in v:
            raise InputError("--extra", f"{v!r}: expected SRC:DEST (e.g. netload/bin/netload:/usr/bin/netload)")
        src, dest = v.split(":", 1)
        if not dest.startswith("/"):
            raise InputError("--extra", f"{v!r}: DEST must be an absolute path in the guest")
        out.append(ExtraFile(src, dest))
    return out


def build_guest(args: argparse.Namespace, runner: Runner, force: bool = False) -> ProbeGuest:
    workdir = ensure_dir(args.workdir or default_workdir(), "work directory")
    builder = GuestBuilder(workdir, runner, kernel=args.kernel, modules_dir=args.modules_dir, extra=parse_extra(args.extra))
    return builder.build(force=force)


def register(sub: Any) -> None:
    p = sub.add_parser("guest", help="build the probe guest, detect the accelerator")
    gs = p.add_subparsers(dest="guest_cmd", metavar="ACTION", parser_class=type(p))
    b = gs.add_parser("build", help="build (or reuse) the probe guest initramfs")
    add_guest_options(b)
    b.add_argument("--force", action="store_true", help="rebuild even when the cache is current")
    b.set_defaults(func=run_build)
    a = gs.add_parser("accel", help="boot the probe guest under KVM to see whether KVM really works here")
    add_guest_options(a)
    a.add_argument("--timeout", type=float, default=8.0, help="seconds the KVM probe may take (default 8)")
    a.add_argument("--no-cache", action="store_true", help="probe again even if a recent answer is cached")
    a.set_defaults(func=run_accel)
    p.set_defaults(func=lambda _a: (p.print_help(), 2)[1])


def run_build(args: argparse.Namespace) -> int:
    g = build_guest(args, Runner(), force=args.force)
    print(f"probe guest {g.key} ({'cached' if g.cached else 'built'})")
    print(f"  kernel   {g.kernel} ({g.release}){' → PVH ' + str(g.vmlinux) if g.vmlinux else ''}")
    print(f"  initrd   {g.initrd} ({g.size / 1e6:.1f} MB)")
    print(f"  tools    {', '.join(g.tools)}")
    print(f"  modules  {', '.join(g.modules)}")
    if g.missing_optional:
        print(f"  missing optional modules: {', '.join(g.missing_optional)}")
    return 0


def run_accel(args: argparse.Namespace) -> int:
    runner = Runner()
    g = build_guest(args, runner)
    workdir = args.workdir or default_workdir()
    choice = detect_accel(g, workdir, runner, timeout=args.timeout, use_cache=not args.no_cache)
    print(f"accelerator: {choice.accel} ({choice.reason}{', cached' if choice.cached else ''})")
    if choice.warning:
        print(f"kvmtune: warning: {choice.warning}", file=sys.stderr)
    return 0
