"""``kvmtune net cleanup``: remove what a killed run left behind.

Leftovers are found two ways and nothing else is touched:

* namespaces named ``kvmtune-<run>-<role>`` (``ip netns list``), with every
  process inside them (``ip netns pids``): nothing but kvmtune puts processes
  there;
* run directories ``<workdir>/net/<run>/``: processes named by a pidfile in
  them, and processes whose command line contains the run directory (OVS
  daemons, QEMU, stand-in relays all carry it), so a process that outlived
  its namespace is found too.

A run is live while its owner holds the lock on one of its namespaces (the
kernel drops it when the owner dies, SIGKILL included) or while the owner pid
recorded in ``owner.json`` still runs with the same start time. Live runs are
skipped unless ``force``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvmtune.host.process import read_pid_stat
from kvmtune.host.root import HostRoot
from kvmtune.lab.net.netns import PREFIX, list_namespaces, namespace_is_locked, namespace_pids
from kvmtune.runner import Runner

_RUN_RE = re.compile(rf"^{re.escape(PREFIX)}([a-z0-9]{{2,12}})-")


def _state(host: HostRoot, pid: int) -> str | None:
    """The process state letter, or None when the pid is gone."""
    st = read_pid_stat(host, pid)
    return st.state if st else None


def _alive(host: HostRoot, pid: int) -> bool:
    return _state(host, pid) not in (None, "Z", "X")


def kill_pids(host: HostRoot, pids: list[int], grace: float = 3.0) -> list[int]:
    """SIGTERM ``pids``, SIGKILL what is left after ``grace`` seconds; return the survivors."""
    pids = [p for p in pids if p != os.getpid() and _alive(host, p)]
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for p in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, sig)
        deadline = time.monotonic() + wait
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if _alive(host, p)]
            if pids:
                time.sleep(0.02)
        if not pids:
            break
    return pids


def _cmdline(host: HostRoot, pid: int) -> str:
    raw = host.read_bytes(f"/proc/{pid}/cmdline") or b""
    return raw.replace(b"\0", b" ").decode(errors="replace")


def _pids_mentioning(host: HostRoot, text: str) -> list[int]:
    out = []
    for entry in host.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid() and text in _cmdline(host, int(entry)):
            out.append(int(entry))
    return out


@dataclass
class Leftover:
    runid: str
    namespaces: list[str] = field(default_factory=list)
    rundir: Path | None = None
    live: bool = False
    owner_pid: int | None = None


@dataclass
class CleanupReport:
    removed_namespaces: list[str] = field(default_factory=list)
    killed: list[str] = field(default_factory=list)
    removed_dirs: list[str] = field(default_factory=list)
    skipped_live: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def nothing_found(self) -> bool:
        return not (self.removed_namespaces or self.killed or self.removed_dirs or self.skipped_live or self.problems)


def _owner_alive(host: HostRoot, rundir: Path) -> int | None:
    try:
        owner = json.loads((rundir / "owner.json").read_text())
    except (OSError, ValueError):
        return None
    pid = owner.get("pid")
    if not isinstance(pid, int) or not _alive(host, pid):
        return None
    st = read_pid_stat(host, pid)
    if owner.get("starttime") is not None and (st is None or str(st.starttime) != str(owner["starttime"])):
        return None
    return pid


def find_leftovers(runner: Runner, host: HostRoot, workdir: Path) -> list[Leftover]:
    runs: dict[str, Leftover] = {}
    for name in list_namespaces(runner):
        if not name.startswith(PREFIX):
            continue
        m = _RUN_RE.match(name)
        runid = m.group(1) if m else name
        runs.setdefault(runid, Leftover(runid)).namespaces.append(name)
    netdir = workdir / "net"
    if netdir.is_dir():
        for d in sorted(netdir.iterdir()):
            if d.is_dir() and re.fullmatch(r"[a-z0-9]{2,12}", d.name):
                runs.setdefault(d.name, Leftover(d.name)).rundir = d
    for lo in runs.values():
        lo.live = any(namespace_is_locked(n) for n in lo.namespaces)
        if lo.rundir is not None:
            lo.owner_pid = _owner_alive(host, lo.rundir)
            lo.live = lo.live or lo.owner_pid is not None
    return sorted(runs.values(), key=lambda r: r.runid)


def cleanup(
    runner: Runner,
    host: HostRoot,
    workdir: Path,
    *,
    force: bool = False,
    dry_run: bool = False,
    skip: set[str] | frozenset[str] = frozenset(),
) -> CleanupReport:
    """``skip``: run ids left alone (e.g. a namespace so new its owner may not have locked it yet)."""
    report = CleanupReport()
    for lo in find_leftovers(runner, host, workdir):
        if lo.runid in skip:
            continue
        if lo.live and not force:
            report.skipped_live.append(f"run {lo.runid} (owner pid {lo.owner_pid or '?'})")
            continue
        pids: dict[int, str] = {}
        for ns in lo.namespaces:
            for p in namespace_pids(runner, ns):
                pids[p] = f"in {ns}"
        if lo.rundir is not None:
            marker = str(lo.rundir)
            for pidfile in lo.rundir.rglob("*.pid"):
                with contextlib.suppress(OSError, ValueError):
                    p = int(pidfile.read_text().strip())
                    if marker in _cmdline(host, p):
                        pids[p] = f"pidfile {pidfile.name}"
            for p in _pids_mentioning(host, marker):
                pids.setdefault(p, "names its run directory")
        if lo.owner_pid is not None:
            pids.pop(lo.owner_pid, None)  # never the owner itself, even with --force
        pids.pop(os.getpid(), None)
        for p, why in sorted(pids.items()):
            if _alive(host, p):
                comm = (host.read_optional(f"/proc/{p}/comm") or "?").strip()
                report.killed.append(f"{p} {comm} ({why})")
        if dry_run:
            report.removed_namespaces += lo.namespaces
            if lo.rundir is not None:
                report.removed_dirs.append(str(lo.rundir))
            continue
        survivors = kill_pids(host, list(pids))
        report.problems += [f"pid {p} survived SIGKILL" for p in survivors]
        for ns in lo.namespaces:
            res = runner.run(["ip", "netns", "del", ns], timeout=30)
            if res.ok or "No such file" in res.stderr:
                report.removed_namespaces.append(ns)
            else:
                report.problems.append(f"{ns}: {res.describe_failure()}")
        if lo.rundir is not None:
            shutil.rmtree(lo.rundir, ignore_errors=True)
            report.removed_dirs.append(str(lo.rundir))
    return report
