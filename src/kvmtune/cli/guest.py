"""``kvmtune guest build`` / ``kvmtune guest accel``: the probe guest and the accelerator it gets."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvmtune.cli.command import Command, Outcome
from kvmtune.errors import InputError, UsageError
from kvmtune.lab.accel import detect_accel
from kvmtune.lab.accel_cache import CACHE_NAME
from kvmtune.lab.guest import ExtraFile, GuestBuilder, ProbeGuest
from kvmtune.lab.loadguest import LOADS, LoadGuest, parse_job
from kvmtune.lab.net.netload import find_netload
from kvmtune.lab.workdir import default_workdir, ensure_dir
from kvmtune.runner import Runner
from kvmtune.textsafe import safe


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


def build_guest(args: argparse.Namespace, runner: Runner, force: bool = False,
                more: tuple[ExtraFile, ...] = ()) -> ProbeGuest:
    workdir = ensure_dir(args.workdir or default_workdir(), "work directory")
    builder = GuestBuilder(workdir, runner, kernel=args.kernel, modules_dir=args.modules_dir,
                           extra=[*parse_extra(args.extra), *more])
    return builder.build(force=force)


def cache_left(workdir: Path) -> str:
    """What ``guest run`` leaves in the work directory on purpose: the probe guest (reused by the next run) and the
    accelerator verdict."""
    guest = workdir / "guest"
    files = [p for p in guest.iterdir() if p.is_file()] if guest.is_dir() else []
    size = sum(p.stat().st_size for p in files) / 2**20
    parts = [f"{guest} (the probe guest's kernel and initramfs, {len(files)} file(s), {size:.0f} MiB: reused by the "
             "next run; kvmtune guest build --force rebuilds it)"] if files else []
    if (workdir / CACHE_NAME).is_file():
        parts.append(f"{workdir / CACHE_NAME} (the accelerator verdict; kvmtune guest accel --no-cache probes again)")
    return "; ".join(parts) or "nothing"


class GuestBuildCommand(Command):
    name = "build"
    help = "build (or reuse) the probe guest initramfs"

    def options(self, p: argparse.ArgumentParser) -> None:
        add_guest_options(p)
        p.add_argument("--force", action="store_true", help="rebuild even when the cache is current")

    def run(self, args: argparse.Namespace) -> Outcome:
        g = build_guest(args, Runner(), force=args.force)
        lines = [f"probe guest {g.key} ({'cached' if g.cached else 'built'})",
                 f"  kernel   {g.kernel} ({g.release}){' → PVH ' + str(g.vmlinux) if g.vmlinux else ''}",
                 f"  initrd   {g.initrd} ({g.size / 1e6:.1f} MB)",
                 f"  tools    {', '.join(g.tools)}",
                 f"  modules  {', '.join(g.modules)}"]
        if g.missing_optional:
            lines.append(f"  missing optional modules: {', '.join(g.missing_optional)}")
        return Outcome(result="".join(f"{line}\n" for line in lines))


class GuestAccelCommand(Command):
    name = "accel"
    help = "boot the probe guest under KVM to see whether KVM really works here"

    def options(self, p: argparse.ArgumentParser) -> None:
        add_guest_options(p)
        p.add_argument("--timeout", type=float, default=8.0, help="seconds the KVM probe may take (default 8)")
        p.add_argument("--no-cache", action="store_true", help="probe again even if a recent answer is cached")

    def run(self, args: argparse.Namespace) -> Outcome:
        runner = Runner()
        g = build_guest(args, runner)
        workdir = args.workdir or default_workdir()
        choice = detect_accel(g, workdir, runner, timeout=args.timeout, use_cache=not args.no_cache)
        text = f"accelerator: {choice.accel} ({safe(choice.reason)}{', cached' if choice.cached else ''})\n"
        return Outcome(result=text, errors=[f"warning: {choice.warning}"] if choice.warning else [])


class GuestRunCommand(Command):
    name = "run"
    help = "boot the probe guest with a steady load, to watch with top, why and sample"
    description = ("Boot the probe guest as libvirt and Proxmox VE start QEMU (-name N,debug-threads=on, a QMP socket) "
                   "with a steady cpu, disk or net load; it stops on Ctrl-C or after --seconds. Under TCG every number "
                   "it shows is an emulation number.")

    def options(self, p: argparse.ArgumentParser) -> None:
        add_guest_options(p)
        p.add_argument("--load", choices=LOADS, required=True, help="what the guest keeps busy")
        p.add_argument("--name", default="kvmtune-load", help="its QEMU -name (default kvmtune-load)")
        p.add_argument("--pin", metavar="CPUS", help="host CPUs QEMU may run on (taskset list, e.g. 0 or 2-3)")
        p.add_argument("--smp", type=int, default=1, metavar="N", help="vCPUs (default 1)")
        p.add_argument("--seconds", type=float, default=None, metavar="S", help="stop after S seconds (default: Ctrl-C)")
        p.add_argument("--job", metavar="OPTIONS", default=None,
                       help="--load disk: fio options appended after the defaults (rw=randrw bs=4k ioengine=libaio "
                            "iodepth=1), overriding them, e.g. 'rw=randrw rwmixread=70 bs=16k iodepth=8'; pattern "
                            "options only (no file, no program, no external engine)")

    def check(self, args: argparse.Namespace) -> None:
        if not args.name or not all(c.isalnum() or c in "-_." for c in args.name):
            raise UsageError(f"--name {args.name!r}: letters, digits, '-', '_' and '.' only")
        if args.pin is not None and not all(part.replace("-", "", 1).isdigit() for part in args.pin.split(",")):
            raise UsageError(f"--pin {args.pin!r}: a CPU list such as 0, 0-3 or 1,3")
        if not 1 <= args.smp <= 64:
            raise UsageError(f"--smp must be between 1 and 64, got {args.smp}")
        if args.seconds is not None and args.seconds <= 0:
            raise UsageError(f"--seconds must be above 0, got {args.seconds:g}")
        if args.job is not None:
            if args.load != "disk":
                raise UsageError(f"--job is for --load disk, not --load {args.load}")
            parse_job(args.job)  # OptionError: one line naming the token, exit 2

    def run(self, args: argparse.Namespace) -> Outcome:
        runner = Runner()
        netload = find_netload(None, runner) if args.load == "net" else None
        g = build_guest(args, runner, more=(ExtraFile(netload, "/usr/bin/netload"),) if netload else ())
        workdir = args.workdir or default_workdir()
        choice = detect_accel(g, workdir, runner)
        load = LoadGuest(g, args.load, args.name, choice.accel, workdir, runner, pin=args.pin, smp=args.smp,
                         netload=netload, job=parse_job(args.job) if args.job is not None else None)
        try:
            pid = load.start()
            emulation = " (TCG: every number it shows is an emulation number)" if choice.accel == "tcg" else ""
            print(f"guest {args.name}: pid {pid}, --load {args.load}, accelerator {choice.accel}{emulation}\n"
                  f"  watch it: kvmtune top · kvmtune why {args.name} · kvmtune sample --pid {pid} --duration 10\n"
                  f"  stop it: Ctrl-C{'' if args.seconds is None else f' (or wait {args.seconds:g} s)'}", flush=True)
            for line in load.wait(args.seconds):
                print(f"  console: {safe(line)}", flush=True)
        finally:  # on Ctrl-C too: what went, and what stays for the next run
            done = load.close()
            print(f"guest {args.name}: {'; '.join(done) or 'nothing was started'}\n"
                  f"  left in the cache: {safe(cache_left(workdir))}", flush=True)
        return Outcome()


class GuestCommand(Command):
    name = "guest"
    help = "build the probe guest, detect the accelerator, run it with a load"
    subcommands = (GuestBuildCommand, GuestAccelCommand, GuestRunCommand)


COMMANDS = (GuestCommand,)
