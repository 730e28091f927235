"""``kvmtune capture-host DIR``: copy the files the host rules read into a fixture tree.

The capture runs every host fact and host rule against a recording
:class:`~kvmtune.host.capture.RecordingHostRoot`, then :func:`~kvmtune.host.capture.write_capture`
writes what was read below DIR, so ``kvmtune audit --root DIR`` reproduces this host's audit on any
machine (secrets on QEMU command lines redacted; nothing written outside DIR).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.audit.rule import HostRule, all_rules
from kvmtune.cli.command import Command, Outcome, root_option
from kvmtune.errors import UsageError
from kvmtune.host.capture import RecordingHostRoot, write_capture
from kvmtune.host.facts import HostFacts
from kvmtune.qemu.process import running_qemu_guests
from kvmtune.qemu.redact import redact_cmdline
from kvmtune.textsafe import safe


class CaptureHostCommand(Command):
    name = "capture-host"
    help = "capture the files the host audit reads into a fixture tree"
    description = ("Copy the /proc, /sys, /etc and /dev entries the host rules read into DIR, so that "
                   "'kvmtune audit --root DIR' reproduces this host's audit elsewhere (for bug reports and tests).")

    def options(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("dest", metavar="DIR", type=Path, help="directory to create (must not exist or be empty)")
        root_option(p, "capture from this tree instead of / (re-capture)")
        p.add_argument("--force", action="store_true", help="write into DIR even if it is not empty")

    def check(self, args: argparse.Namespace) -> None:
        dest: Path = args.dest
        if dest.exists() and (not dest.is_dir() or (any(dest.iterdir()) and not args.force)):
            raise UsageError(f"{dest}: exists and is not an empty directory (use --force)")

    def run(self, args: argparse.Namespace) -> Outcome:
        dest: Path = args.dest
        dest.mkdir(parents=True, exist_ok=True)
        manifest = capture(args.root, dest)
        return Outcome(result=(
            f"captured {manifest['files']} files and {manifest['placeholders']} placeholders into {safe(dest)} "
            f"(kernel {safe(manifest['kernel'])}, {len(manifest['qemu_processes'])} QEMU process(es), "
            f"{len(manifest['unreadable'])} unreadable, {manifest['redacted_values']} value(s) redacted); "
            f"audit it with: kvmtune audit --root {safe(dest)}\n"
        ))


COMMANDS = (CaptureHostCommand,)


def capture(src_root: str, dest: Path) -> dict[str, Any]:
    """Run the host facts and host rules against ``src_root`` while recording, and write the tree to ``dest``."""
    rec = RecordingHostRoot(src_root)
    facts = HostFacts(rec, probe=False, guests=running_qemu_guests)
    facts.load_all()
    host_rules = [r for r in all_rules() if issubclass(r, HostRule)]
    findings = run_rules(AuditContext(host=rec, host_facts=facts), audit_host=True, rules=host_rules)
    return write_capture(rec, facts, dest, findings=[f.rule for f in findings], redact=redact_cmdline)
