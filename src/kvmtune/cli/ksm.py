"""``kvmtune ksm``: what Kernel Samepage Merging is doing on this host, and whether it pays."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import TextIO

from kvmtune.cli.command import Command, Exit, Outcome, format_option, root_option
from kvmtune.host.facts import HostFacts
from kvmtune.host.ksm import KsmReport, build_report
from kvmtune.host.root import HostRoot
from kvmtune.qemu.process import running_qemu_guests
from kvmtune.textsafe import safe


class KsmCommand(Command):
    name = "ksm"
    help = "show KSM's state, what it saves and what it costs"
    description = ("Show Kernel Samepage Merging's state: pages shared and sharing, sharing and waste ratios, "
                   "volatile pages, memory saved, full scans, ksmd's CPU time and advice for this host.")

    def options(self, p: argparse.ArgumentParser) -> None:
        root_option(p, "read /proc and /sys below DIR (a captured host)")
        format_option(p, ("text", "json"))

    def run(self, args: argparse.Namespace) -> Outcome:
        host = HostRoot(args.root)
        facts = HostFacts(host, guests=running_qemu_guests)
        rep = build_report(facts)
        where = "this host" if host.is_live else args.root
        return Outcome(Exit.USAGE if facts.errors else Exit.OK, _Shown(rep, where), list(facts.errors))

    def render(self, outcome: Outcome, fmt: str, out: TextIO, *, color: bool) -> None:
        shown = outcome.result
        assert isinstance(shown, _Shown)
        if fmt == "json":
            out.write(json.dumps(shown.report.to_json(), indent=2) + "\n")
        else:
            out.write(render_text(shown.report, safe(shown.where)))


COMMANDS = (KsmCommand,)


@dataclass
class _Shown:
    report: KsmReport
    where: str  # "this host", or the captured tree's path


def _num(v: int | None) -> str:
    return "-" if v is None else f"{v:,}"


def _bytes(b: int | float | None) -> str:
    if b is None:
        return "-"
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(b) >= div:
            return f"{b / div:.1f} {unit}"
    return f"{int(b)} B"


def render_text(rep: KsmReport, where: str) -> str:
    lines = [f"KSM on {where}: {rep.state}"]
    if rep.available:
        c = rep.counters
        ps = rep.page_size
        lines += [
            f"  pages_shared     {_num(c.get('pages_shared')):>14}   KSM pages backing the shared pool "
            f"({_bytes((c.get('pages_shared') or 0) * ps)})",
            f"  pages_sharing    {_num(c.get('pages_sharing')):>14}   guest pages mapped onto them",
            f"  pages_unshared   {_num(c.get('pages_unshared')):>14}   unique pages scanned again and again",
            f"  pages_volatile   {_num(c.get('pages_volatile')):>14}   pages changing too fast to merge",
            f"  full_scans       {_num(c.get('full_scans')):>14}",
            f"  sharing ratio    {_fmt(rep.sharing_ratio):>14}   pages_sharing / pages_shared (higher is better)",
            f"  waste ratio      {_fmt(rep.waste_ratio):>14}   pages_unshared / pages_sharing (lower is better)",
            f"  memory saved     {_bytes(rep.saved_bytes):>14}   pages_sharing × {ps} B"
            + (f"; general_profit {_bytes(rep.general_profit_bytes)}" if rep.general_profit_bytes is not None else ""),
        ]
        if rep.scan_pages_per_s is not None:
            lines.append(
                f"  scan rate        {rep.scan_pages_per_s:>14,.0f}   pages/s ({c.get('pages_to_scan')} every "
                f"{c.get('sleep_millisecs')} ms = {_bytes(rep.scan_pages_per_s * ps)}/s)"
                + ("" if rep.run == 1 else " when running")
            )
        if rep.ksmd_cpu_percent is not None:
            lines.append(f"  ksmd CPU         {rep.ksmd_cpu_percent:>13.2f}%   of one CPU since ksmd started")
        if c.get("merge_across_nodes") is not None:
            lines.append(f"  merge_across_nodes {c.get('merge_across_nodes')} on {rep.numa_nodes} NUMA node(s)")
    mem = f"{rep.guest_memory_kib / 1048576:.1f} GiB"
    total = f"{rep.mem_total_kib / 1048576:.1f} GiB" if rep.mem_total_kib else "?"
    ratio = f" ({rep.memory_ratio:.2f}×)" if rep.memory_ratio is not None else ""
    lines.append(f"  guests           {rep.guests} running, {mem} assigned on {total} RAM{ratio}")
    lines.append("Advice:")
    lines += [f"  - {a}" for a in rep.advice]
    return "\n".join(lines) + "\n"


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"
