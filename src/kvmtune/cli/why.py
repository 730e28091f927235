"""``kvmtune why GUEST``: where one guest's time went while sampled, who took it, and the rule that explains it."""

from __future__ import annotations

import argparse
import json
from typing import TextIO

from kvmtune.cli.command import Command, Outcome, format_option, output_option, root_option, settings_of
from kvmtune.cli.top import DEFAULT_URI
from kvmtune.domain.connection import libvirt_answers
from kvmtune.errors import UsageError
from kvmtune.host.root import HostRoot
from kvmtune.live.sources import Sampler
from kvmtune.live.why import WhyReport, why
from kvmtune.textsafe import safe


class WhyCommand(Command):
    name = "why"
    uses_settings = True  # the [thresholds] top and sample judge the same signals with
    help = "why one running guest is slow: where its time went, who took it, the rule and the fix"
    description = ("Sample one running guest (a libvirt name or UUID, a QEMU pid, or a QEMU -name) for --seconds and "
                   "print a ranked breakdown: vCPU waits and who ran instead, CPU quota, disks (throttling, latency), "
                   "network drops, memory; each line with its evidence, rule, fix and the experiment that proves it.")

    def options(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("guest", metavar="GUEST", help="libvirt name or UUID, QEMU pid, or QEMU -name")
        p.add_argument("--seconds", type=float, default=10.0, metavar="S", help="how long to sample (default 10)")
        p.add_argument("-c", "--connect", action="append", default=None, metavar="URI",
                       help=f"libvirt URI to look in (repeatable; default {DEFAULT_URI} when it answers)")
        p.add_argument("--no-libvirt", action="store_true", help="look at QEMU processes only")
        root_option(p, "read /proc and /sys below DIR")
        format_option(p, ("text", "json"))
        output_option(p, "write here (atomically) instead of stdout")

    def check(self, args: argparse.Namespace) -> None:
        if not 1.0 <= args.seconds <= 3600:
            raise UsageError(f"--seconds must be between 1 and 3600, got {args.seconds:g}")
        if not args.guest.strip() or any(ord(c) < 32 for c in args.guest):
            raise UsageError("GUEST: empty, or holds control characters")

    def run(self, args: argparse.Namespace) -> Outcome:
        host = HostRoot(args.root)
        uris: list[str] = []
        if not args.no_libvirt:
            if args.connect:
                uris = list(args.connect)
            elif host.is_live and libvirt_answers(DEFAULT_URI):
                uris = [DEFAULT_URI]
        sampler = Sampler(host, uris)
        try:
            return Outcome(result=why(host, sampler, args.guest, args.seconds, settings_of(args).thresholds))
        finally:
            sampler.close()

    def render(self, outcome: Outcome, fmt: str, out: TextIO, *, color: bool) -> None:
        report = outcome.result
        assert isinstance(report, WhyReport)
        if fmt == "json":
            out.write(json.dumps(report.as_json(), indent=2) + "\n")
            return
        out.write(render_text(report))


def render_text(r: WhyReport) -> str:
    t = r.target
    where = ", ".join(dict.fromkeys(x for x in (f"pid {t.pid}" if t.pid is not None else "", t.source) if x))
    if t.owner:  # a QEMU libvirt did not start: any user may run one under any -name
        where += f", run by {safe(t.owner)}"
    lines = [f"why {t.name} ({where}): sampled {r.seconds:.1f} s"]
    if r.emulation:
        lines.append("EMULATION: this guest runs under TCG, not KVM: every number below is an emulation number")
    if not r.lines:
        measured = [x for x in ("vCPU wait under 5 %",) if "vcpu-delay" not in r.not_measured]
        measured.append("no throttling, no disk latency, drops or memory pressure past their thresholds")
        lines.append(f"Nothing here explains it: no signal passed its threshold ({', '.join(measured)})"
                     + ("; not measured: " + ", ".join(r.not_measured) if r.not_measured else ""))
    for line in r.lines:
        share = "" if line.share is None else f"{line.share:.0%}"
        lines.append(f"{share:>5}  {line.area.upper():<6} {line.what}")
        lines.append(f"{'':13}evidence: {line.evidence}")
        lines.append(f"{'':13}cause:    {line.cause}")
        lines.append(f"{'':13}rule:     {line.rule or line.no_rule or 'no rule covers this'}")
        if line.fix:
            lines.append(f"{'':13}fix:      {line.fix}")
        lines.append(f"{'':13}verify:   {line.verify}")
    lines.extend(f"not measured: {signal}: {why}" for signal, why in r.not_measured.items())
    lines.extend(f"note: {n}" for n in r.notes)
    return "".join(safe(line) + "\n" for line in lines)


COMMANDS = (WhyCommand,)
