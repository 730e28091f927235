"""What killed benchmarks left behind, found and removed when the next benchmark starts.

Children die with kvmtune (``PR_SET_PDEATHSIG``, see :mod:`kvmtune.runner`), but
kernel objects do not: network namespaces (with their links), loop devices,
mounts and the work directory's ``scratch-*`` directories. A run's leftovers are
found only through what marks them as kvmtune's and says whether their owner is
gone, nothing else is touched:

* namespaces ``kvmtune-<run>-<role>`` of runs whose run directory
  ``<workdir>/net/<run>`` is in this work directory: the lock on the namespace
  file and ``owner.json`` (:func:`kvmtune.lab.net.cleanup.find_leftovers`); a
  namespace that its run's ``owner.json`` does not name yet and that was made in
  the last few seconds may still be waiting for its owner and is left for the
  next start (``owner.json`` is written before each namespace is made, so a
  killed run's namespaces are removed at any age); other work directories' runs are left to their own
  next start or to ``kvmtune net cleanup``;
* ``<workdir>/scratch-*`` directories: their ``owner.json`` (pid, process start
  time, boot id); with a dead owner, the loop devices backed by files in them are
  detached, mounts below them unmounted and the directory removed. Empty scratch
  directories (of any owner no longer running) are removed too.

The benchmark runner calls :func:`sweep` before it measures and prints one line;
``--keep-leftovers`` lists them instead of removing them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvmtune.host.facts import HostFacts
from kvmtune.host.root import HostRoot
from kvmtune.lab.net.netns import NETNS_DIR
from kvmtune.lab.workdir import OWNER_FILE, read_owner, release_file
from kvmtune.runner import Runner

NAMESPACE_GRACE_S = 10.0  # a namespace younger than this may be one whose owner has not locked it yet


@dataclass
class SweepReport:
    found: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    kept: bool = False

    def line(self) -> str | None:
        """The one line a benchmark prints about leftovers, or None when there were none."""
        if not self.found and not self.problems:
            return None
        what = ", ".join(self.found[:8]) + (f" and {len(self.found) - 8} more" if len(self.found) > 8 else "")
        if self.kept:
            return f"kvmtune: leftovers of killed runs kept (--keep-leftovers): {what}"
        tail = f"; problems: {'; '.join(self.problems)}" if self.problems else ""
        return f"kvmtune: removed leftovers of killed runs: {what or 'none'}{tail}"


def _loop_devices_under(host: HostRoot, directory: Path) -> list[str]:
    """Loop devices whose backing file lies in ``directory`` (from sysfs, read through HostRoot)."""
    out = []
    prefix = str(directory.resolve()) + "/"
    for name in host.listdir("/sys/block"):
        if not name.startswith("loop"):
            continue
        backing = (host.read_optional(f"/sys/block/{name}/loop/backing_file") or "").strip()
        if backing.removesuffix(" (deleted)").startswith(prefix):
            out.append(f"/dev/{name}")
    return out


def _mounts_under(host: HostRoot, directory: Path) -> list[str]:
    prefix = str(directory.resolve()) + "/"
    out = []
    for line in (host.read_optional("/proc/self/mountinfo") or "").splitlines():
        fields = line.split()
        if len(fields) > 4:
            point = fields[4].replace("\\040", " ")
            if (point + "/").startswith(prefix):
                out.append(point)
    return sorted(out, key=len, reverse=True)  # innermost first


def _scratch_leftovers(runner: Runner, host: HostRoot, workdir: Path, keep: bool, report: SweepReport) -> None:
    if not workdir.is_dir():
        return
    for d in sorted(workdir.glob("scratch-*")):
        if not d.is_dir() or d.is_symlink():
            continue
        owner = read_owner(d)
        if owner is not None and owner.alive(host):
            continue
        try:
            contents = [p.name for p in d.iterdir() if p.name not in (OWNER_FILE, f".{OWNER_FILE}.tmp")]
        except OSError:
            continue
        if owner is None and contents:
            continue  # not marked as kvmtune's (an older kvmtune's, or the user's): left alone
        loops = _loop_devices_under(host, d)
        mounts = _mounts_under(host, d)
        report.found += [f"mount {m}" for m in mounts] + [f"loop {dev}" for dev in loops] + [f"{d.name}/"]
        if keep:
            continue
        for m in mounts:
            res = runner.run(["umount", "--lazy", m], timeout=30)
            if not res.ok:
                report.problems.append(f"{m}: {res.describe_failure()}")
        for dev in loops:
            res = runner.run(["losetup", "-d", dev], timeout=30)
            if not res.ok:
                report.problems.append(f"{dev}: {res.describe_failure()}")
        if _discards(host, d):  # a killed block-tier run's images: merge their extents first, as the run would have
            for path in _regular_files(d):
                release_file(path, coalesce=True)
        shutil.rmtree(d, ignore_errors=True)


def _discards(host: HostRoot, path: Path) -> bool:
    """``path`` lies on a file system mounted with ``discard`` (each freed extent costs one discard)."""
    best, found = "", False
    for m in HostFacts(host).mounts:
        inside = str(path) == m.mountpoint or str(path).startswith(m.mountpoint.rstrip("/") + "/")
        if inside and len(m.mountpoint) >= len(best):
            best, found = m.mountpoint, m.has_option("discard")
    return found


def _regular_files(directory: Path) -> list[Path]:
    """Regular files under ``directory``: links are not followed, other file systems not entered."""
    found: list[Path] = []
    dev = directory.lstat().st_dev
    for root, dirs, files in os.walk(directory):  # does not descend into links to directories
        dirs[:] = [n for n in dirs if os.lstat(os.path.join(root, n)).st_dev == dev]
        found += [Path(root, n) for n in files if stat.S_ISREG(os.lstat(os.path.join(root, n)).st_mode)]
    return found


def _young(name: str) -> bool:
    try:
        return time.time() - os.stat(os.path.join(NETNS_DIR, name)).st_mtime < NAMESPACE_GRACE_S
    except OSError:
        return False


def _named_by_owner_record(rundir: Path, namespaces: list[str]) -> bool:
    """True when the run directory's owner.json lists every one of ``namespaces``."""
    try:
        owner = json.loads((rundir / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return False
    named = owner.get("namespaces") if isinstance(owner, dict) else None
    return isinstance(named, list) and set(namespaces) <= set(named)


def _network_leftovers(runner: Runner, host: HostRoot, workdir: Path, keep: bool, report: SweepReport) -> None:
    from kvmtune.lab.net.cleanup import cleanup, find_leftovers
    from kvmtune.lab.net.netns import NetError

    try:
        leftovers = find_leftovers(runner, host, workdir)
    except NetError as exc:
        report.problems.append(str(exc))
        return
    # only runs of this work directory: another work directory's runs (another user's, a test's) are
    # left to its own next start or to 'kvmtune net cleanup'
    # A run's owner.json is written before its first namespace exists, so a namespace it names is its
    # owner's from birth: with that owner dead it is a leftover at any age. Only a namespace that no
    # owner record names yet gets the grace time (its maker may still be about to write one).
    young = {
        lo.runid
        for lo in leftovers
        if lo.rundir is None or (not _named_by_owner_record(lo.rundir, lo.namespaces) and any(_young(ns) for ns in lo.namespaces))
    }
    dead = [lo for lo in leftovers if not lo.live and lo.runid not in young]
    if not dead:
        return
    if keep:
        report.found += [ns for lo in dead for ns in lo.namespaces] + [f"net/{lo.runid}/" for lo in dead if lo.rundir]
        return
    rep = cleanup(runner, host, workdir, skip=young)
    report.found += rep.removed_namespaces + [f"net/{Path(d).name}/" for d in rep.removed_dirs] + rep.killed
    report.problems += rep.problems


def sweep(runner: Runner, host: HostRoot, workdir: Path, *, keep: bool = False) -> SweepReport:
    """Find (and unless ``keep`` remove) what killed runs left; never touches a live run's things."""
    report = SweepReport(kept=keep)
    with contextlib.suppress(PermissionError):
        _scratch_leftovers(runner, host, workdir, keep, report)
    if os.geteuid() == 0:  # only root can have made (or remove) namespaces and loop devices
        _network_leftovers(runner, host, workdir, keep, report)
    return report
