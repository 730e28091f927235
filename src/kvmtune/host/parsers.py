"""Pure parsers for the text the kernel writes under /proc, /sys and /etc.

Every function takes text (or a mapping of file name to text) and returns
plain data. None of them touch the file system: :mod:`kvmtune.host.facts`
reads the files through :class:`~kvmtune.host.root.HostRoot` and calls
these. A parser raises :class:`ValueError` with a short reason ("holds
'banana', expected an integer") when the text is not what the kernel writes;
the caller adds the file name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

LEGACY_SCHEDULERS = frozenset({"noop", "deadline", "cfq", "anticipatory"})
MQ_SCHEDULERS = frozenset({"none", "mq-deadline", "kyber", "bfq"})


def _show(text: str, limit: int = 40) -> str:
    t = text.strip().replace("\n", "\\n")
    return t if len(t) <= limit else t[: limit - 1] + "…"


def parse_int(text: str) -> int:
    """A sysfs/procfs integer file (``"200000\\n"``)."""
    t = text.strip()
    try:
        return int(t, 10)
    except ValueError:
        raise ValueError(f"holds {_show(t)!r}, expected an integer") from None


def parse_int_list(text: str, count: int | None = None) -> list[int]:
    """Whitespace-separated integers, e.g. ``net.ipv4.tcp_rmem`` (``"4096 131072 6291456"``)."""
    parts = text.split()
    try:
        values = [int(p, 10) for p in parts]
    except ValueError:
        raise ValueError(f"holds {_show(text)!r}, expected integers") from None
    if count is not None and len(values) != count:
        raise ValueError(f"holds {_show(text)!r}, expected {count} integers")
    return values


def parse_bool_param(text: str) -> bool:
    """A module parameter shown as ``Y``/``N`` or ``1``/``0``."""
    t = text.strip()
    if t in ("Y", "y", "1"):
        return True
    if t in ("N", "n", "0"):
        return False
    raise ValueError(f"holds {_show(t)!r}, expected Y or N")


@dataclass(frozen=True)
class Choice:
    """A sysfs multiple-choice file such as ``always [madvise] never``."""

    current: str
    options: tuple[str, ...]


def parse_bracket_choice(text: str) -> Choice:
    """Parse ``mq-deadline kyber [bfq] none`` → current ``bfq``.

    A file with one word and no brackets (``none`` on a device without
    elevators) is that word.
    """
    words = text.split()
    if not words:
        raise ValueError("is empty, expected a list of choices")
    current = [w[1:-1] for w in words if w.startswith("[") and w.endswith("]")]
    options = tuple(w.strip("[]") for w in words)
    if len(current) == 1:
        return Choice(current[0], options)
    if not current and len(words) == 1 and re.fullmatch(r"[A-Za-z0-9_-]+", words[0]):
        return Choice(words[0], options)
    raise ValueError(f"holds {_show(text)!r}, expected choices with one in [brackets]")


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` → field name to value in KiB (counts such as HugePages_Total as-is)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        if ":" not in line:
            continue
        key, _, rest = line.partition(":")
        parts = rest.split()
        if not parts:
            continue
        try:
            out[key.strip()] = int(parts[0])
        except ValueError:
            continue
    if "MemTotal" not in out:
        raise ValueError(f"holds {_show(text)!r}, expected a MemTotal line")
    return out


@dataclass(frozen=True)
class CpuTimes:
    """Aggregate CPU time from the ``cpu`` line of ``/proc/stat``, in USER_HZ ticks."""

    user: int
    nice: int
    system: int
    idle: int
    iowait: int = 0
    irq: int = 0
    softirq: int = 0
    steal: int = 0
    guest: int = 0  # already counted in user
    guest_nice: int = 0  # already counted in nice
    cpus: int = 0  # number of cpuN lines

    @property
    def total(self) -> int:
        return self.user + self.nice + self.system + self.idle + self.iowait + self.irq + self.softirq + self.steal

    @property
    def busy(self) -> int:
        return self.total - self.idle - self.iowait

    def busy_fraction(self) -> float | None:
        return self.busy / self.total if self.total > 0 else None


def parse_proc_stat(text: str) -> CpuTimes:
    agg: list[int] | None = None
    cpus = 0
    for line in text.splitlines():
        if line.startswith("cpu "):
            try:
                agg = [int(x) for x in line.split()[1:]]
            except ValueError:
                raise ValueError(f"has a garbled cpu line {_show(line)!r}") from None
        elif re.match(r"cpu\d+ ", line):
            cpus += 1
    if agg is None or len(agg) < 4:
        raise ValueError(f"holds {_show(text)!r}, expected a 'cpu' line with at least 4 counters")
    agg += [0] * (10 - len(agg))
    user, nice, system, idle, iowait, irq, softirq, steal, guest, guest_nice = agg[:10]
    return CpuTimes(user, nice, system, idle, iowait, irq, softirq, steal, guest, guest_nice, cpus)


def parse_cpuinfo_flags(text: str) -> set[str]:
    """CPU feature flags: x86 ``flags``, arm64 ``Features``, s390 ``features`` (first CPU)."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features", "features"):
            return set(value.split())
    return set()


def parse_cpuinfo_model(text: str) -> str | None:
    """The first ``model name`` of /proc/cpuinfo (absent on some architectures)."""
    for line in text.splitlines():
        if line.startswith("model name") and ":" in line:
            return line.split(":", 1)[1].strip()
    return None


def format_cpu_list(cpus: set[int] | frozenset[int]) -> str:
    """The kernel's compact form: ``{0, 1, 2, 5}`` → ``0-2,5``."""
    out: list[str] = []
    run: list[int] = []
    for cpu in sorted(cpus):
        if run and cpu == run[-1] + 1:
            run.append(cpu)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [cpu]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def parse_cpu_list(text: str) -> set[int]:
    """A kernel CPU list such as ``0-3,8,10-11`` (empty text → empty set)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = part.split("-", 1)
                cpus.update(range(int(lo), int(hi) + 1))
            else:
                cpus.add(int(part))
        except ValueError:
            raise ValueError(f"holds {_show(text)!r}, expected a CPU list like 0-3,8") from None
    return cpus


def parse_cpu_mask(text: str) -> set[int]:
    """A hex CPU bitmap as in ``rps_cpus``: ``00000000,0000000f`` → {0, 1, 2, 3}."""
    t = text.strip().replace(",", "")
    if not t:
        return set()
    try:
        value = int(t, 16)
    except ValueError:
        raise ValueError(f"holds {_show(text)!r}, expected a hex CPU mask") from None
    return {i for i in range(value.bit_length()) if value >> i & 1}


def format_cpu_mask(cpus: set[int]) -> str:
    value = 0
    for c in cpus:
        value |= 1 << c
    return f"{value:x}"


def parse_count(text: str) -> int | None:
    """A non-negative decimal count in ASCII digits, else None (``"²".isdigit()`` holds, ``int("²")`` fails)."""
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() else None


def parse_flat_keyed(text: str | None) -> dict[str, int]:
    """A cgroup v2 flat-keyed file (``cpu.stat``: ``key value`` per line); lines without a count are skipped."""
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        count = parse_count(value)
        if key and count is not None:
            out[key] = count
    return out


def parse_psi_total(text: str | None) -> int | None:
    """'some … total=N' (µs) of a ``*.pressure`` file (a cgroup's or /proc/pressure's)."""
    for line in (text or "").splitlines():
        if line.startswith("some "):
            for part in line.split():
                if part.startswith("total=") and (count := parse_count(part[6:])) is not None:
                    return count
    return None


def parse_status_kib(text: str, key: str) -> int | None:
    """One ``Key:  N kB`` field of ``/proc/PID/status`` or ``smaps_rollup`` (the first line of that key)."""
    for line in text.splitlines():
        if line.startswith(key + ":"):
            value = line.split(":", 1)[1].split()
            return parse_count(value[0]) if value else None
    return None


def parse_uevent(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


@dataclass(frozen=True)
class Mount:
    device: str
    mountpoint: str
    fstype: str
    options: tuple[str, ...]

    def has_option(self, *names: str) -> bool:
        return any(o in names for o in self.options)


def _unescape_mount(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mounts(text: str) -> list[Mount]:
    """``/proc/mounts`` (or ``/proc/self/mounts``); octal escapes such as ``\\040`` decoded."""
    mounts: list[Mount] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        mounts.append(
            Mount(_unescape_mount(parts[0]), _unescape_mount(parts[1]), parts[2], tuple(parts[3].split(",")))
        )
    return mounts


def mount_for(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount holding ``path``: longest mount point prefix, the last one mounted on a point wins."""
    best: Mount | None = None
    best_len = -1
    for m in mounts:
        mp = m.mountpoint.rstrip("/")
        if (mp == "" or path == mp or path.startswith(mp + "/")) and len(mp) >= best_len:
            best, best_len = m, len(mp)
    return best


@dataclass(frozen=True)
class SwapArea:
    filename: str
    type: str
    size_kib: int
    used_kib: int
    priority: int

    @property
    def is_zram(self) -> bool:
        return "/zram" in self.filename


def parse_swaps(text: str) -> list[SwapArea]:
    areas: list[SwapArea] = []
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 5:
            continue
        try:
            areas.append(SwapArea(parts[0], parts[1], int(parts[2]), int(parts[3]), int(parts[4])))
        except ValueError:
            raise ValueError(f"has a garbled line {_show(line)!r}") from None
    return areas


@dataclass(frozen=True)
class PidStat:
    pid: int
    comm: str
    state: str
    utime: int  # ticks
    stime: int  # ticks
    starttime: int  # ticks after boot


def parse_pid_stat(text: str) -> PidStat:
    """``/proc/<pid>/stat``; the command name may hold spaces and parentheses."""
    lpar, rpar = text.find("("), text.rfind(")")
    if lpar < 0 or rpar < lpar:
        raise ValueError(f"holds {_show(text)!r}, expected 'pid (comm) state …'")
    try:
        pid = int(text[:lpar].strip())
        rest = text[rpar + 1 :].split()
        # rest[0] is field 3 (state); utime = field 14, stime = 15, starttime = 22
        return PidStat(pid, text[lpar + 1 : rpar], rest[0], int(rest[11]), int(rest[12]), int(rest[19]))
    except (ValueError, IndexError):
        raise ValueError(f"holds {_show(text)!r}, expected the 52 fields of proc(5)") from None


def parse_uptime(text: str) -> float:
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        raise ValueError(f"holds {_show(text)!r}, expected seconds since boot") from None


@dataclass(frozen=True)
class SoftnetCpu:
    processed: int
    dropped: int
    time_squeeze: int


def parse_softnet_stat(text: str) -> list[SoftnetCpu]:
    """``/proc/net/softnet_stat``: one line per CPU of hex counters (processed, dropped, squeezed, …)."""
    out: list[SoftnetCpu] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        try:
            out.append(SoftnetCpu(int(parts[0], 16), int(parts[1], 16), int(parts[2], 16)))
        except ValueError:
            raise ValueError(f"has a garbled line {_show(line)!r}") from None
    return out


@dataclass(frozen=True)
class SysctlSetting:
    file: str
    line: int
    key: str
    value: str


def sysctl_key(key: str) -> str:
    """Normalise ``net/ipv4/tcp_tw_reuse`` or ``net.ipv4.tcp_tw_reuse`` to the dotted form."""
    return key.strip().lstrip("-").replace("/", ".")


def parse_sysctl_conf(text: str, file: str = "") -> list[SysctlSetting]:
    """``/etc/sysctl.conf`` and ``sysctl.d/*.conf``: ``key = value`` lines, comments dropped."""
    out: list[SysctlSetting] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            continue
        out.append(SysctlSetting(file, n, sysctl_key(key), " ".join(value.split())))
    return out


def parse_kernel_cmdline(text: str) -> dict[str, str]:
    """``/proc/cmdline`` → parameter to value (``""`` for flags); the first ``--`` ends it."""
    out: dict[str, str] = {}
    for tok in text.split():
        if tok == "--":
            break
        key, _, value = tok.partition("=")
        out[key] = value
    return out


@dataclass
class KsmStats:
    """``/sys/kernel/mm/ksm/*`` as numbers; ``None`` where the kernel lacks the file."""

    run: int | None = None
    pages_shared: int | None = None
    pages_sharing: int | None = None
    pages_unshared: int | None = None
    pages_volatile: int | None = None
    full_scans: int | None = None
    pages_to_scan: int | None = None
    sleep_millisecs: int | None = None
    merge_across_nodes: int | None = None
    use_zero_pages: int | None = None
    ksm_zero_pages: int | None = None
    general_profit: int | None = None
    max_page_sharing: int | None = None
    problems: list[str] = field(default_factory=list)  # "<file>: <reason>" for garbled files

    FIELDS = (
        "run", "pages_shared", "pages_sharing", "pages_unshared", "pages_volatile", "full_scans",
        "pages_to_scan", "sleep_millisecs", "merge_across_nodes", "use_zero_pages", "ksm_zero_pages",
        "general_profit", "max_page_sharing",
    )

    @property
    def running(self) -> bool:
        return self.run == 1

    @property
    def sharing_ratio(self) -> float | None:
        """pages_sharing / pages_shared: how many guest pages each KSM page backs (higher is better)."""
        if not self.pages_shared or self.pages_sharing is None:
            return None
        return self.pages_sharing / self.pages_shared

    @property
    def waste_ratio(self) -> float | None:
        """pages_unshared / pages_sharing: scanning spent on unique pages (lower is better)."""
        if not self.pages_sharing or self.pages_unshared is None:
            return None
        return self.pages_unshared / self.pages_sharing

    def saved_bytes(self, page_size: int = 4096) -> int | None:
        """Memory KSM saves: pages_sharing pages (the kernel's "how much saved")."""
        if self.pages_sharing is None:
            return None
        return self.pages_sharing * page_size + (self.ksm_zero_pages or 0) * page_size


def parse_ksm(files: dict[str, str]) -> KsmStats:
    """Parse the files of ``/sys/kernel/mm/ksm`` given as name → text.

    A garbled file does not spoil the others: its field stays ``None`` and
    the reason is listed in ``problems``.
    """
    stats = KsmStats()
    for name in KsmStats.FIELDS:
        if name not in files:
            continue
        try:
            setattr(stats, name, parse_int(files[name]))
        except ValueError as exc:
            stats.problems.append(f"{name}: {exc}")
    return stats


@dataclass(frozen=True)
class DiskCounters:
    """One /proc/diskstats line (kernel ≥ 4.18 has discards, ≥ 5.5 flushes)."""

    name: str
    reads: int
    sectors_read: int
    writes: int
    sectors_written: int
    discards: int = 0
    flushes: int = 0
    io_ticks_ms: int = 0
    read_ms: int = 0  # ms spent on reads (field 7), and on writes (field 11): await = ms / ios
    write_ms: int = 0

    @property
    def ios(self) -> int:
        # iostat's tps: reads + writes + discards completed (flushes are not counted)
        return self.reads + self.writes + self.discards


def parse_diskstats(text: str) -> dict[str, DiskCounters]:
    """/proc/diskstats by device name; short or garbled lines are skipped (the file is rewritten as we read)."""
    out: dict[str, DiskCounters] = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) < 14:
            continue
        try:
            v = [int(x) for x in f[3:]]
        except ValueError:
            continue
        out[f[2]] = DiskCounters(
            name=f[2],
            reads=v[0],
            sectors_read=v[2],
            writes=v[4],
            sectors_written=v[6],
            io_ticks_ms=v[9],
            read_ms=v[3],
            write_ms=v[7],
            discards=v[11] if len(v) > 11 else 0,
            flushes=v[15] if len(v) > 15 else 0,
        )
    return out


@dataclass(frozen=True)
class ZfsArc:
    """The ZFS ARC's size and its limits in bytes (``/proc/spl/kstat/zfs/arcstats``)."""

    size: int
    c_min: int
    c_max: int


def parse_arcstats(text: str) -> ZfsArc:
    """``arcstats``: a kstat header line, ``name type data``, then one ``name type value`` line per statistic."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) == 3 and f[1].isdigit() and f[2].isdigit():
            values[f[0]] = int(f[2])
    missing = [k for k in ("size", "c_min", "c_max") if k not in values]
    if missing:
        raise ValueError(f"no {', '.join(missing)} in arcstats")
    return ZfsArc(values["size"], values["c_min"], values["c_max"])


def parse_pve_firewall_enable(text: str) -> bool:
    """``/etc/pve/firewall/cluster.fw``: ``enable: 1`` in its ``[OPTIONS]`` section (PVE's default: off)."""
    section = ""
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip().upper()
        elif section == "OPTIONS" and ":" in line:
            key, value = (x.strip() for x in line.split(":", 1))
            if key == "enable":
                return value == "1"
    return False
