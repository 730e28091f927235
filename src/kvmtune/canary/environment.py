"""The environment of a canary run: what a regression may be blamed on (docs/canary.md, "Environment").

Everything is read through the host root (``--root`` trees supply fixtures) and the one runner. The dpkg status file is
another program's file, read as hostile: bounded, a regular file only (no link out of the tree), split on ``\\n`` only,
a package's fields taken from its first stanza with ``Status: install ok installed``; a duplicate stanza is a problem
named, not a second truth."""

from __future__ import annotations

import os
import re
from typing import Any

from kvmtune.canary.kvmcost import kvm_module
from kvmtune.host.root import HostReadError, HostRoot
from kvmtune.runner import Runner
from kvmtune.textsafe import safe

DPKG_STATUS = "/var/lib/dpkg/status"
DPKG_LIMIT = 64 << 20
WATCHED = ("qemu-system-x86", "qemu-system-common", "qemu-system-data", "qemu-utils", "qemu-block-extra",
           "libvirt-daemon", "libvirt-daemon-system", "libvirt0", "fio", "intel-microcode", "amd64-microcode",
           "firmware-linux-nonfree", "linux-image-amd64", "linux-image-arm64", "systemd")
WATCHED_PREFIXES = ("linux-image-",)
_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]{0,127}$")
_VERSION = re.compile(r"^[A-Za-z0-9.+~:-]{1,128}$")
# what `changed` compares between runs (load, throttling counts and the scratch fs's fill are figures, not settings)
COMPARED = ("kvm_module", "kernel", "cmdline", "versions", "packages", "governor", "mitigations", "thp", "ksm", "cgroup_limits",
            "scratch_fs")


class DpkgStatusError(ValueError):
    pass


def watched(name: str) -> bool:
    return name in WATCHED or name.startswith(WATCHED_PREFIXES)


def parse_dpkg_status(text: str, where: str = DPKG_STATUS) -> dict[str, str]:
    """Installed watched packages → version. ``\\n`` separates lines (dpkg writes nothing else); a CR, U+2028 or
    any other control or separator character inside a name or version makes that stanza unusable (named)."""
    if "\r" in text:
        raise DpkgStatusError(f"{where}: has carriage returns (dpkg writes \\n line ends only); not read")
    out: dict[str, str] = {}
    seen: set[tuple[str, str]] = set()
    for n, stanza in enumerate(text.split("\n\n"), 1):
        fields: dict[str, str] = {}
        for line in stanza.split("\n"):
            if not line or line[0] in " \t":
                continue  # continuation lines (descriptions, conffiles) say nothing kvmtune reads
            key, sep, value = line.partition(":")
            if sep and key in ("Package", "Status", "Version", "Architecture") and key not in fields:
                fields[key] = value.strip(" \t")
        name, version = fields.get("Package"), fields.get("Version")
        if name is None or version is None or fields.get("Status") != "install ok installed":
            continue
        if not _NAME.fullmatch(name):
            if any(watched(w) and w in name for w in WATCHED):
                raise DpkgStatusError(f"{where}: stanza {n}: package name {safe(name)!r} is not a Debian package name")
            continue
        if not watched(name):
            continue
        if not _VERSION.fullmatch(version):
            raise DpkgStatusError(f"{where}: package {name}: version {safe(version)!r} is not a Debian version")
        arch = fields.get("Architecture", "")
        if (name, arch) in seen:
            raise DpkgStatusError(f"{where}: package {name} is installed twice (duplicate stanzas); not trusted")
        seen.add((name, arch))
        out[name if name not in out else f"{name}:{safe(arch)}"] = version
    return out


def read_packages(host: HostRoot) -> dict[str, str]:
    """The watched packages' versions from the dpkg status file; {} on a host without dpkg."""
    try:
        text = host.read_text(DPKG_STATUS, limit=DPKG_LIMIT + 1)
    except HostReadError as exc:
        if exc.problem == "absent":
            return {}
        raise DpkgStatusError(f"{DPKG_STATUS}: {exc.problem}") from None
    if len(text) > DPKG_LIMIT:
        raise DpkgStatusError(f"{DPKG_STATUS}: larger than {DPKG_LIMIT >> 20} MiB; not read")
    return parse_dpkg_status(text)


def _first_line(text: str | None) -> str | None:
    if text is None:
        return None
    line = text.strip().split("\n", 1)[0]
    return safe(line[:300]) if line else None


def _version(runner: Runner, argv: list[str]) -> str | None:
    if runner.which(argv[0]) is None:
        return None
    res = runner.run(argv, timeout=20)
    return _first_line(res.stdout or res.stderr) if res.ok else None


def _own_cgroup(host: HostRoot) -> tuple[str, dict[str, str]]:
    """(v1|v2, controller → this process's cgroup path)."""
    paths: dict[str, str] = {}
    for line in (host.read_optional("/proc/self/cgroup") or "").split("\n"):
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2].startswith("/") and ".." not in parts[2].split("/"):
            for ctl in (parts[1].split(",") if parts[1] else [""]):
                paths[ctl] = parts[2]
    v2 = host.exists("/sys/fs/cgroup/cgroup.controllers")
    return ("v2" if v2 else "v1"), paths


def cgroup_limits(host: HostRoot) -> tuple[dict[str, str], int | None]:
    """The canary's own cgroup CPU and I/O limits, and its ``nr_throttled`` so far."""
    kind, paths = _own_cgroup(host)
    limits: dict[str, str] = {"cgroup": kind}
    throttled: str | None = None
    if kind == "v2":
        base = "/sys/fs/cgroup" + paths.get("", "/").rstrip("/")
        for name in ("cpu.max", "io.max", "cpu.weight"):
            value = host.read_optional(f"{base}/{name}")
            if value is not None:
                limits[name] = safe(" ".join(value.split())[:200])
        stat = host.read_optional(f"{base}/cpu.stat") or ""
    else:
        cpu = "/sys/fs/cgroup/cpu" + paths.get("cpu", "/").rstrip("/")
        if not host.exists(cpu):
            cpu = "/sys/fs/cgroup/cpu,cpuacct" + paths.get("cpu", "/").rstrip("/")
        for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us", "cpu.shares"):
            value = host.read_optional(f"{cpu}/{name}")
            if value is not None:
                limits[name] = safe(value.strip()[:40])
        blkio = "/sys/fs/cgroup/blkio" + paths.get("blkio", "/").rstrip("/")
        for name in ("blkio.throttle.read_iops_device", "blkio.throttle.write_iops_device",
                     "blkio.throttle.read_bps_device", "blkio.throttle.write_bps_device"):
            value = host.read_optional(f"{blkio}/{name}")
            if value:
                limits[name] = safe(" ".join(value.split())[:200])
        stat = host.read_optional(f"{cpu}/cpu.stat") or ""
    for line in stat.split("\n"):
        key, _, value = line.partition(" ")
        if key == "nr_throttled":
            throttled = value.strip()
    return limits, int(throttled) if throttled and throttled.isdigit() else None


def _scratch_fs(host: HostRoot, directory: str) -> dict[str, str]:
    best: tuple[int, dict[str, str]] = (-1, {})
    for line in (host.read_optional("/proc/self/mountinfo") or "").split("\n"):
        left, sep, right = line.partition(" - ")
        fields, rest = left.split(" "), right.split(" ")
        if not sep or len(fields) < 5 or len(rest) < 2:
            continue
        point = fields[4].replace("\\040", " ")
        if (directory == point or directory.startswith(point.rstrip("/") + "/")) and len(point) > best[0]:
            best = (len(point), {"mount": safe(point), "fstype": safe(rest[0]), "source": safe(rest[1])})
    return best[1]


def collect(runner: Runner, host: HostRoot, scratch_dir: str, packages_root: HostRoot | None = None) -> dict[str, Any]:
    """The environment of one run (JSON-ready); the dpkg status file below ``packages_root`` (default ``host``)."""
    vulns: dict[str, str] = {}
    vdir = "/sys/devices/system/cpu/vulnerabilities"
    if host.is_dir(vdir):
        for name in sorted(host.listdir(vdir))[:64]:
            value = _first_line(host.read_optional(f"{vdir}/{name}"))
            if value is not None:
                vulns[safe(name)] = value
    limits, throttled = cgroup_limits(host)
    load = (host.read_optional("/proc/loadavg") or "").split()
    versions = {
        "qemu": _version(runner, ["qemu-system-x86_64", "--version"]),
        "qemu-storage-daemon": _version(runner, ["qemu-storage-daemon", "--version"]),
        "libvirtd": _version(runner, ["libvirtd", "--version"]),
        "fio": _version(runner, ["fio", "--version"]),
    }
    microcode = None
    for line in (host.read_optional("/proc/cpuinfo") or "").split("\n"):
        if line.startswith("microcode"):
            microcode = safe(line.partition(":")[2].strip()[:40])
            break
    return {
        "hostname": _first_line(host.read_optional("/proc/sys/kernel/hostname")),
        "kvm_module": kvm_module(host),
        "kernel": _first_line(host.read_optional("/proc/sys/kernel/osrelease")),
        "cmdline": _first_line(host.read_optional("/proc/cmdline")),
        "versions": {k: v for k, v in versions.items() if v is not None} | ({"microcode": microcode} if microcode else {}),
        "packages": read_packages(packages_root or host),
        "governor": _first_line(host.read_optional("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")),
        "mitigations": vulns,
        "thp": _first_line(host.read_optional("/sys/kernel/mm/transparent_hugepage/enabled")),
        "ksm": _first_line(host.read_optional("/sys/kernel/mm/ksm/run")),
        "cgroup_limits": limits,
        "nr_throttled": throttled,
        "loadavg": [float(x) for x in load[:3]] if len(load) >= 3 and all(_float(x) for x in load[:3]) else None,
        "ncpu": len(os.sched_getaffinity(0)),
        "scratch_fs": _scratch_fs(host, scratch_dir),
    }


def _float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, str]]:
    """What changed between two runs' environments: ``[{"what", "before", "after"}]``, packages by name."""
    out: list[dict[str, str]] = []
    for key in COMPARED:
        a, b = before.get(key), after.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            for sub in sorted(set(a) | set(b)):
                if a.get(sub) != b.get(sub):
                    what = sub if key == "packages" else f"{key} {sub}"
                    out.append({"what": what, "before": _show(a.get(sub)), "after": _show(b.get(sub))})
        elif a != b:
            out.append({"what": key, "before": _show(a), "after": _show(b)})
    return out


def _show(value: Any) -> str:
    return "(none)" if value is None else safe(str(value))
