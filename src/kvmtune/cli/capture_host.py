"""``kvmtune capture-host DIR``: copy the files the host rules read into a fixture tree.

The capture runs every host fact and host rule against a recording
:class:`HostRoot`, then writes what was read (and the directory entries that
were listed) below DIR, so ``kvmtune audit --root DIR`` reproduces this
host's audit on any machine. Only QEMU processes and ``ksmd`` are kept from
/proc/<pid>; secrets on QEMU command lines are redacted. Device nodes become
empty placeholder files. Nothing is written outside DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvmtune import __version__
from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.audit.rule import HostRule, all_rules
from kvmtune.host.facts import HostFacts
from kvmtune.host.process import is_qemu_binary
from kvmtune.host.root import HostRoot
from kvmtune.qemu.cmdline import split_proc_cmdline
from kvmtune.qemu.process import running_qemu_guests
from kvmtune.qemu.redact import redact_argv

PID_PATH = re.compile(r"^/proc/(\d+)/")
MANIFEST = "CAPTURE.json"
PLACEHOLDER = ".captured-directory"


@dataclass
class RecordingHostRoot(HostRoot):
    """A HostRoot that also remembers what was listed, tested and linked."""

    listed: list[str] = field(default_factory=list)
    tested: list[str] = field(default_factory=list)

    def exists(self, host_path: str) -> bool:
        self.tested.append(host_path)
        return super().exists(host_path)

    def is_dir(self, host_path: str) -> bool:
        self.tested.append(host_path)
        return super().is_dir(host_path)

    def listdir(self, host_path: str) -> list[str]:
        self.listed.append(host_path)
        return super().listdir(host_path)

    def readlink(self, host_path: str) -> str | None:
        self.tested.append(host_path)
        return super().readlink(host_path)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "capture-host", help="capture the files the host audit reads into a fixture tree",
        description="Copy the /proc, /sys, /etc and /dev entries the host rules read into DIR, so that "
        "'kvmtune audit --root DIR' reproduces this host's audit elsewhere (for bug reports and tests).",
    )
    p.add_argument("dest", metavar="DIR", help="directory to create (must not exist or be empty)")
    p.add_argument("--root", default="/", metavar="DIR", help="capture from this tree instead of / (re-capture)")
    p.add_argument("--force", action="store_true", help="write into DIR even if it is not empty")
    p.set_defaults(func=run)


def redact_cmdline(data: bytes) -> tuple[bytes, int]:
    """Blank every secret of a QEMU command line, parsed option by option (:mod:`kvmtune.qemu.redact`)."""
    out, count = redact_argv(split_proc_cmdline(data))
    return b"\0".join(a.encode("utf-8", "surrogateescape") for a in out) + b"\0", count


def capture(src_root: str, dest: Path) -> dict[str, Any]:
    """Run the host audit against ``src_root`` while recording, and write the tree to ``dest``."""
    rec = RecordingHostRoot(src_root)
    facts = HostFacts(rec, probe=False, guests=running_qemu_guests)
    facts.load_all()
    ctx = AuditContext(host=rec, host_facts=facts)
    host_rules = [r for r in all_rules() if issubclass(r, HostRule)]
    findings = run_rules(ctx, audit_host=True, rules=host_rules)

    keep_pids = {str(pid) for pid in _qemu_pids(rec)}
    if facts.ksmd is not None:
        keep_pids.add(str(facts.ksmd.pid))

    reads = list(dict.fromkeys(rec.reads))
    probes = list(dict.fromkeys([*rec.tested, *rec.listed]))
    listed = set(rec.listed)
    written: list[str] = []
    unreadable: list[str] = []
    redacted = 0
    for path in reads:
        m = PID_PATH.match(path)
        if m and m.group(1) not in keep_pids:
            continue
        data = HostRoot.read_bytes(rec, path, limit=4 * 1024 * 1024)
        if data is None:
            if HostRoot.exists(rec, path):
                unreadable.append(path)
            continue
        if m and path.endswith("/cmdline") and data:
            data, n = redact_cmdline(data)
            redacted += n
        target = dest / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        written.append(path)

    placeholders = 0
    for path in probes:
        if path in listed:
            placeholders += _recreate_listing(rec, path, dest, keep_pids)
        elif HostRoot.exists(rec, path) and not os.path.lexists(dest / path.lstrip("/")):
            placeholders += _placeholder(rec, path, dest)

    manifest = {
        "tool": f"kvmtune {__version__}",
        "captured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "source_root": src_root,
        "kernel": facts.kernel_release,
        "files": len(written),
        "placeholders": placeholders,
        "unreadable": unreadable,
        "redacted_values": redacted,
        "qemu_processes": sorted(keep_pids - ({str(facts.ksmd.pid)} if facts.ksmd else set())),
        "findings_at_capture": sorted({f.rule for f in findings}),
        "errors_at_capture": facts.errors,
    }
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def _qemu_pids(rec: HostRoot) -> list[int]:
    pids = []
    for path in list(dict.fromkeys(rec.reads)):  # a snapshot: reading appends to rec.reads
        m = re.fullmatch(r"/proc/(\d+)/cmdline", path)
        if not m:
            continue
        data = HostRoot.read_bytes(rec, path) or b""
        argv0 = data.split(b"\0", 1)[0].decode("utf-8", "replace")
        if is_qemu_binary(argv0):
            pids.append(int(m.group(1)))
    return pids


def _placeholder(rec: HostRoot, path: str, dest: Path) -> int:
    real = Path(rec.path) / path.lstrip("/")
    target = dest / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    if real.is_symlink():
        os.symlink(os.readlink(real), target)
    elif real.is_dir():
        target.mkdir(exist_ok=True)
        (target / PLACEHOLDER).touch()  # git keeps no empty directories; kind detection needs e.g. bridge/
    else:
        target.touch()  # device nodes and files only tested for existence
    return 1


def _recreate_listing(rec: HostRoot, path: str, dest: Path, keep_pids: set[str]) -> int:
    n = 0
    base = dest / path.lstrip("/")
    base.mkdir(parents=True, exist_ok=True)
    for name in HostRoot.listdir(rec, path):
        if path == "/proc" and name.isdigit() and name not in keep_pids:
            continue
        if path == "/proc" and not name.isdigit():
            continue  # /proc's own files are captured when read
        child = f"{path.rstrip('/')}/{name}"
        if not os.path.lexists(dest / child.lstrip("/")):
            n += _placeholder(rec, child, dest)
    if not any(base.iterdir()):
        (base / PLACEHOLDER).touch()
    return n


def run(args: argparse.Namespace) -> int:
    dest = Path(args.dest)
    if dest.exists() and (not dest.is_dir() or (any(dest.iterdir()) and not args.force)):
        print(f"kvmtune: error: {dest}: exists and is not an empty directory (use --force)", file=sys.stderr)
        return 2
    if not os.path.isdir(args.root):
        print(f"kvmtune: error: --root {args.root}: not a directory", file=sys.stderr)
        return 2
    dest.mkdir(parents=True, exist_ok=True)
    manifest = capture(args.root, dest)
    print(
        f"captured {manifest['files']} files and {manifest['placeholders']} placeholders into {dest} "
        f"(kernel {manifest['kernel']}, {len(manifest['qemu_processes'])} QEMU process(es), "
        f"{len(manifest['unreadable'])} unreadable, {manifest['redacted_values']} value(s) redacted); "
        f"audit it with: kvmtune audit --root {dest}"
    )
    return 0
