"""What ``kvmtune capture-host DIR`` writes: the files the host audit read, below DIR.

The caller runs every host fact and host rule against a :class:`RecordingHostRoot`; :func:`write_capture`
then writes what was read (and the directory entries that were listed) below DIR, so ``kvmtune audit --root
DIR`` reproduces the audit on any machine. Only QEMU processes and ``ksmd`` are kept from /proc/<pid>;
secrets on QEMU command lines are blanked by the ``redact`` function the caller passes. Device nodes become
empty placeholder files. Nothing is written outside DIR.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvmtune import __version__
from kvmtune.host.facts import HostFacts
from kvmtune.host.process import is_qemu_binary
from kvmtune.host.root import HostRoot

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


def write_capture(rec: RecordingHostRoot, facts: HostFacts, dest: Path, *, findings: list[str],
                  redact: Callable[[bytes], tuple[bytes, int]]) -> dict[str, Any]:
    """Write below ``dest`` what ``rec`` recorded while ``facts`` were read and the host rules ran
    (``findings``: their rule ids), and the manifest. ``redact`` blanks the secrets of a QEMU
    ``/proc/<pid>/cmdline`` (:func:`kvmtune.qemu.redact.redact_cmdline`). Nothing is written outside ``dest``."""
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
            data, n = redact(data)
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
        "source_root": rec.path,
        "kernel": facts.kernel_release,
        "files": len(written),
        "placeholders": placeholders,
        "unreadable": unreadable,
        "redacted_values": redacted,
        "qemu_processes": sorted(keep_pids - ({str(facts.ksmd.pid)} if facts.ksmd else set())),
        "findings_at_capture": sorted(set(findings)),
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
