"""The host as the host rules see it: facts read lazily through a :class:`HostRoot`.

Each fact is read once, on first use, and cached. A file that is absent is
simply "not there" (``None`` or an empty list): kernels differ, and the rule
decides what absence means. A file that exists but cannot be read, or holds
something the kernel would never write, becomes one line in ``errors``
naming the file and the problem; the fact is then ``None`` and the rest of
the audit goes on.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from kvmtune.host.blockdev import block_device_of
from kvmtune.host.parsers import (
    LEGACY_SCHEDULERS,
    Choice,
    CpuTimes,
    KsmStats,
    Mount,
    PidStat,
    SoftnetCpu,
    SwapArea,
    SysctlSetting,
    ZfsArc,
    parse_arcstats,
    parse_bracket_choice,
    parse_cpu_list,
    parse_cpu_mask,
    parse_cpuinfo_flags,
    parse_cpuinfo_model,
    parse_int,
    parse_int_list,
    parse_kernel_cmdline,
    parse_ksm,
    parse_meminfo,
    parse_mounts,
    parse_pid_stat,
    parse_proc_stat,
    parse_pve_firewall_enable,
    parse_softnet_stat,
    parse_swaps,
    parse_sysctl_conf,
    parse_uevent,
    parse_uptime,
    sysctl_key,
)
from kvmtune.host.process import is_qemu_binary
from kvmtune.host.root import HostReadError, HostRoot

if TYPE_CHECKING:
    from kvmtune.host.probe import AccelVerdict, KvmProbe
    from kvmtune.model.guest import Guest

    # who finds the running guests: the caller passes ``kvmtune.qemu.process.running_qemu_guests``
    # (the host reader does not parse QEMU command lines)
    GuestFinder = Callable[[HostRoot], tuple[list[Guest], list[str]]]

T = TypeVar("T")

QEMU_DEFAULT_MEMORY_KIB = 128 * 1024  # QEMU's -m default
SKIP_BLOCK_PREFIXES = ("loop", "ram", "zram", "dm-", "md", "sr", "fd", "nbd", "rbd", "drbd", "bcache", "mmcblk")
# ksmtuned (PVE's ksm-control-daemon) starts KSM when less than this % of RAM is free to it, or when the QEMU
# processes' memory comes within it of RAM
KSMTUNED_THRES_COEF_DEFAULT = 20
SYSCTL_CONF_DIRS = ("/usr/lib/sysctl.d", "/lib/sysctl.d", "/run/sysctl.d", "/etc/sysctl.d")


@dataclass(frozen=True)
class BlockDevice:
    name: str
    kind: str  # nvme | ssd | hdd | virtual
    rotational: bool | None
    scheduler: str
    available: tuple[str, ...]
    path: str  # the scheduler file

    @property
    def legacy(self) -> bool:
        """A single-queue (pre-blk-mq) elevator list: noop/deadline/cfq."""
        return any(s in LEGACY_SCHEDULERS for s in self.available)


@dataclass
class NetDevice:
    name: str
    kind: str  # loopback | bridge | tap | macvtap | vlan | bond | physical | virtual
    mtu: int | None = None
    tx_queue_len: int | None = None
    operstate: str | None = None
    master: str | None = None
    lower: list[str] = field(default_factory=list)
    ports: list[str] = field(default_factory=list)
    rx_queues: list[str] = field(default_factory=list)
    speed_mbps: int | None = None
    tx_dropped: int | None = None
    numa_node: int | None = None

    @property
    def path(self) -> str:
        return f"/sys/class/net/{self.name}"

    @property
    def is_up(self) -> bool:
        return self.operstate in ("up", "unknown")


@dataclass(frozen=True)
class IdleState:
    """One cpuidle state: ``state3`` ``C6`` with a 133 µs exit latency, enabled."""

    entry: str
    name: str
    latency_us: int
    disabled: bool


@dataclass(frozen=True)
class ThpState:
    enabled: Choice | None
    defrag: Choice | None
    base: str  # /sys/kernel/mm/transparent_hugepage or the RHEL 6 redhat_ variant


class HostFacts:
    """Lazily read, cached facts about one host root."""

    def __init__(self, host: HostRoot, errors: list[str] | None = None, *, probe: bool | None = None,
                 guests: GuestFinder | None = None, accel_verdict: AccelVerdict | None = None) -> None:
        """``guests`` finds the running guests (``kvmtune.qemu.process.running_qemu_guests``); without it
        :attr:`guests` is a programming error. ``accel_verdict`` is what ``kvmtune guest accel`` last found on
        this machine, read by the caller (``kvmtune.lab.accel_cache.verdict_for``): host/ reads no cache of lab/."""
        self.host = host
        self.errors: list[str] = errors if errors is not None else []
        self._reported: set[str] = set()
        self.probe_enabled = host.is_live if probe is None else probe
        self._find_guests = guests
        self._accel_verdict = accel_verdict

    # -- reading helpers -------------------------------------------------------------------

    def where(self, path: str) -> str:
        """The file as the user can find it: the host path, or the path inside a captured tree."""
        if self.host.is_live:
            return path
        return str(Path(self.host.path) / path.lstrip("/"))

    def problem(self, path: str, reason: str) -> None:
        msg = f"{self.where(path)}: {reason}"
        if msg not in self._reported:
            self._reported.add(msg)
            self.errors.append(msg)

    def text(self, path: str, *, quiet: bool = False) -> str | None:
        """The file's text; ``None`` if absent. Unreadable → one error line (unless ``quiet``)."""
        try:
            return self.host.read_text(path)
        except HostReadError as exc:
            if exc.problem != "absent" and not quiet:
                self.problem(path, exc.problem)
            return None

    def parsed(self, path: str, parser: Callable[[str], T], *, quiet: bool = False) -> T | None:
        text = self.text(path, quiet=quiet)
        if text is None:
            return None
        try:
            return parser(text)
        except ValueError as exc:
            if not quiet:
                self.problem(path, str(exc))
            return None

    def integer(self, path: str, *, quiet: bool = False) -> int | None:
        return self.parsed(path, parse_int, quiet=quiet)

    # -- kernel and CPU -------------------------------------------------------------------

    @cached_property
    def kernel_release(self) -> str | None:
        text = self.text("/proc/sys/kernel/osrelease")
        return text.strip() if text else None

    @cached_property
    def kernel_version(self) -> tuple[int, int] | None:
        m = re.match(r"(\d+)\.(\d+)", self.kernel_release or "")
        return (int(m.group(1)), int(m.group(2))) if m else None

    @cached_property
    def online_cpus(self) -> set[int] | None:
        cpus = self.parsed("/sys/devices/system/cpu/online", parse_cpu_list)
        if cpus:
            return cpus
        info = self.text("/proc/cpuinfo")
        if info:
            n = sum(1 for line in info.splitlines() if re.match(r"processor\s*:", line))
            return set(range(n)) if n else None
        return None

    @cached_property
    def thread_siblings(self) -> dict[int, frozenset[int]]:
        """Online CPU → the CPUs sharing its core (SMT siblings, itself included); {} when the kernel does
        not say (no topology directory, or a captured tree without it)."""
        out: dict[int, frozenset[int]] = {}
        for cpu in sorted(self.online_cpus or ()):
            siblings = self.parsed(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list",
                                   parse_cpu_list, quiet=True)
            if siblings:
                out[cpu] = frozenset(siblings)
        return out

    @property
    def cpu_count(self) -> int | None:
        return len(self.online_cpus) if self.online_cpus else None

    @cached_property
    def cpu_flags(self) -> set[str] | None:
        text = self.text("/proc/cpuinfo")
        return parse_cpuinfo_flags(text) if text is not None else None

    @cached_property
    def cpu_model(self) -> str | None:
        text = self.text("/proc/cpuinfo")
        return parse_cpuinfo_model(text) if text is not None else None

    @cached_property
    def cpu_vendor_virt_flag(self) -> str | None:
        """``vmx`` (Intel VT-x), ``svm`` (AMD-V) or ``sie`` (s390), if the CPU shows one."""
        flags = self.cpu_flags or set()
        for f in ("vmx", "svm", "sie"):
            if f in flags:
                return f
        return None

    @cached_property
    def numa_nodes(self) -> dict[int, set[int]]:
        nodes: dict[int, set[int]] = {}
        for entry in self.host.listdir("/sys/devices/system/node"):
            m = re.fullmatch(r"node(\d+)", entry)
            if m:
                cpus = self.parsed(f"/sys/devices/system/node/{entry}/cpulist", parse_cpu_list)
                nodes[int(m.group(1))] = cpus or set()
        return nodes

    @cached_property
    def cpu_times(self) -> CpuTimes | None:
        return self.parsed("/proc/stat", parse_proc_stat)

    @cached_property
    def uptime(self) -> float | None:
        return self.parsed("/proc/uptime", parse_uptime)

    @cached_property
    def kernel_cmdline(self) -> dict[str, str]:
        text = self.text("/proc/cmdline")
        return parse_kernel_cmdline(text) if text else {}

    @cached_property
    def page_size(self) -> int:
        if self.host.is_live:
            try:
                return int(os.sysconf("SC_PAGE_SIZE"))
            except (ValueError, OSError):
                pass
        return 4096

    @cached_property
    def clock_ticks(self) -> int:
        if self.host.is_live:
            try:
                return int(os.sysconf("SC_CLK_TCK"))
            except (ValueError, OSError):
                pass
        return 100

    # -- memory ---------------------------------------------------------------------------

    @cached_property
    def meminfo(self) -> dict[str, int] | None:
        return self.parsed("/proc/meminfo", parse_meminfo)

    @property
    def mem_total_kib(self) -> int | None:
        return self.meminfo.get("MemTotal") if self.meminfo else None

    @cached_property
    def hugepages_reserved(self) -> dict[int, int]:
        """Page size (KiB) -> pages reserved (nr_hugepages), for each size this kernel offers; empty when unknown."""
        base = "/sys/kernel/mm/hugepages"
        out: dict[int, int] = {}
        for entry in self.host.listdir(base):
            m = re.fullmatch(r"hugepages-(\d+)kB", entry)
            if m:
                count = self.integer(f"{base}/{entry}/nr_hugepages")
                if count is not None:
                    out[int(m.group(1))] = count
        return out

    @cached_property
    def swaps(self) -> list[SwapArea] | None:
        return self.parsed("/proc/swaps", parse_swaps)

    @cached_property
    def ksm(self) -> KsmStats | None:
        base = "/sys/kernel/mm/ksm"
        if not self.host.is_dir(base):
            return None
        files: dict[str, str] = {}
        for name in KsmStats.FIELDS:
            text = self.text(f"{base}/{name}")
            if text is not None:
                files[name] = text
        stats = parse_ksm(files)
        for p in stats.problems:
            name, _, reason = p.partition(": ")
            self.problem(f"{base}/{name}", reason)
        return stats

    @cached_property
    def thp(self) -> ThpState | None:
        for base in ("/sys/kernel/mm/transparent_hugepage", "/sys/kernel/mm/redhat_transparent_hugepage"):
            if self.host.is_dir(base):
                enabled = self.parsed(f"{base}/enabled", parse_bracket_choice)
                defrag = self.parsed(f"{base}/defrag", parse_bracket_choice)
                return ThpState(enabled, defrag, base)
        return None

    # -- sysctl and module parameters -----------------------------------------------------------

    @staticmethod
    def sysctl_path(key: str) -> str:
        return "/proc/sys/" + sysctl_key(key).replace(".", "/")

    def sysctl(self, key: str) -> str | None:
        text = self.text(self.sysctl_path(key))
        return " ".join(text.split()) if text is not None else None

    def sysctl_int(self, key: str) -> int | None:
        return self.integer(self.sysctl_path(key))

    def sysctl_ints(self, key: str, count: int | None = None) -> list[int] | None:
        return self.parsed(self.sysctl_path(key), lambda t: parse_int_list(t, count))

    @cached_property
    def sysctl_settings(self) -> list[SysctlSetting]:
        """Every ``key = value`` in /etc/sysctl.conf and the sysctl.d directories, in load order."""
        by_name: dict[str, str] = {}
        for d in SYSCTL_CONF_DIRS:  # a later directory's file of the same name wins, like systemd-sysctl
            for name in self.host.listdir(d):
                if name.endswith(".conf"):
                    by_name[name] = f"{d}/{name}"
        out: list[SysctlSetting] = []
        for name in sorted(by_name):
            text = self.text(by_name[name])
            if text:
                out.extend(parse_sysctl_conf(text, by_name[name]))
        text = self.text("/etc/sysctl.conf")
        if text:
            out.extend(parse_sysctl_conf(text, "/etc/sysctl.conf"))
        return out

    def sysctl_origin(self, key: str) -> str:
        """Where a sysctl is set persistently: ``/etc/sysctl.conf:14`` (the last one wins), or ``""``."""
        k = sysctl_key(key)
        hits = [s for s in self.sysctl_settings if s.key == k]
        return f"{hits[-1].file}:{hits[-1].line}" if hits else ""

    def sysctl_evidence(self, key: str) -> str:
        origin = self.sysctl_origin(key)
        return self.sysctl_path(key) + (f" (set in {origin})" if origin else "")

    @cached_property
    def kvm_loaded(self) -> bool:
        return self.host.is_dir("/sys/module/kvm")

    def module_param(self, module: str, name: str) -> str | None:
        text = self.text(f"/sys/module/{module}/parameters/{name}")
        return text.strip() if text is not None else None

    # -- devices ---------------------------------------------------------------------------

    def device_exists(self, path: str) -> bool:
        return self.host.exists(path)

    def device_accessible(self, path: str) -> bool | None:
        """Read-write access for this user; ``None`` on a captured tree (not meaningful there)."""
        if not self.host.is_live:
            return None
        return self.host.access(path, os.R_OK | os.W_OK)

    @cached_property
    def kvm_probe(self) -> KvmProbe | None:
        if not self.probe_enabled or not self.host.exists("/dev/kvm"):
            return None
        from kvmtune.host.probe import probe_kvm

        return probe_kvm("/dev/kvm")

    @property
    def accel_verdict(self) -> AccelVerdict | None:
        """What ``kvmtune guest accel`` last found on this machine, as the caller passed it in: live root
        only, since the cache in the work directory is this machine's, not a captured tree's."""
        return self._accel_verdict if self.probe_enabled else None

    @cached_property
    def entropy_avail(self) -> int | None:
        return self.integer("/proc/sys/kernel/random/entropy_avail")

    @cached_property
    def entropy_poolsize(self) -> int | None:
        return self.integer("/proc/sys/kernel/random/poolsize")

    # -- storage ---------------------------------------------------------------------------

    @cached_property
    def block_devices(self) -> list[BlockDevice]:
        out: list[BlockDevice] = []
        for name in self.host.listdir("/sys/block"):
            if name.startswith(SKIP_BLOCK_PREFIXES):
                continue
            path = f"/sys/block/{name}/queue/scheduler"
            choice = self.parsed(path, parse_bracket_choice)
            if choice is None:
                continue
            rot = self.integer(f"/sys/block/{name}/queue/rotational")
            rotational = None if rot is None else rot == 1
            if name.startswith("nvme"):
                kind = "nvme"
            elif name.startswith(("vd", "xvd")):
                kind = "virtual"
            elif rotational:
                kind = "hdd"
            else:
                kind = "ssd"
            out.append(BlockDevice(name, kind, rotational, choice.current, choice.options, path))
        return out

    def block_device_of(self, path: str) -> str | None:
        """The block device name (as in /proc/diskstats) holding ``path`` (a local file) or being it; None for tmpfs,
        overlay… (:func:`kvmtune.host.blockdev.block_device_of`)."""
        return block_device_of(self.host, path, local=True)

    def io_scheduler(self, device: str) -> str | None:
        """The active I/O scheduler of ``device``, or of its disk when it is a partition (vda1, nvme0n1p2)."""
        disk = re.sub(r"p?\d+$", "", device) if re.search(r"\d$", device) and not device.startswith("loop") else device
        for dev in dict.fromkeys((device, disk)):
            choice = self.parsed(f"/sys/block/{dev}/queue/scheduler", parse_bracket_choice, quiet=True)
            if choice is not None:
                return choice.current
        return None

    @cached_property
    def mounts(self) -> list[Mount]:
        text = self.text("/proc/mounts")
        if text is None:
            text = self.text("/proc/self/mounts")
        return parse_mounts(text) if text else []

    # -- network ---------------------------------------------------------------------------

    @cached_property
    def net_devices(self) -> dict[str, NetDevice]:
        out: dict[str, NetDevice] = {}
        for name in self.host.listdir("/sys/class/net"):
            base = f"/sys/class/net/{name}"
            if not self.host.exists(f"{base}/mtu"):
                continue  # bonding_masters and other plain files
            uevent = parse_uevent(self.text(f"{base}/uevent", quiet=True) or "")
            devtype = uevent.get("DEVTYPE", "")
            entries = self.host.listdir(base)
            if name == "lo":
                kind = "loopback"
            elif "bridge" in entries or devtype == "bridge":
                kind = "bridge"
            elif "tun_flags" in entries:
                kind = "tap"
            elif "macvtap" in entries:
                kind = "macvtap"
            elif devtype in ("vlan", "bond"):
                kind = devtype
            elif "device" in entries:
                kind = "physical"
            else:
                kind = "virtual"
            dev = NetDevice(name, kind)
            dev.mtu = self.integer(f"{base}/mtu")
            dev.tx_queue_len = self.integer(f"{base}/tx_queue_len")
            oper = self.text(f"{base}/operstate", quiet=True)
            dev.operstate = oper.strip() if oper else None
            master = self.host.readlink(f"{base}/master")
            dev.master = master.rsplit("/", 1)[-1] if master else None
            dev.lower = [e[len("lower_"):] for e in entries if e.startswith("lower_")]
            if kind == "bridge":
                dev.ports = self.host.listdir(f"{base}/brif")
            dev.rx_queues = [q for q in self.host.listdir(f"{base}/queues") if q.startswith("rx-")]
            if kind == "physical":
                speed = self.integer(f"{base}/speed", quiet=True)  # EINVAL while the link is down
                dev.speed_mbps = speed if speed and speed > 0 else None
                node = self.integer(f"{base}/device/numa_node", quiet=True)
                dev.numa_node = node if node is not None and node >= 0 else None
            dev.tx_dropped = self.integer(f"{base}/statistics/tx_dropped", quiet=True)
            out[name] = dev
        return out

    def rps_mask(self, dev: str, queue: str) -> set[int] | None:
        return self.parsed(f"/sys/class/net/{dev}/queues/{queue}/rps_cpus", parse_cpu_mask)

    @cached_property
    def softnet(self) -> list[SoftnetCpu] | None:
        return self.parsed("/proc/net/softnet_stat", parse_softnet_stat)

    # -- processes --------------------------------------------------------------------------

    @cached_property
    def guests(self) -> list[Guest]:
        """Guests running on this host, from the QEMU processes under /proc (found by the caller's finder)."""
        if self._find_guests is None:
            raise RuntimeError("HostFacts.guests needs a guest finder: HostFacts(host, guests=running_qemu_guests)")
        guests, errors = self._find_guests(self.host)
        for err in errors:
            if err not in self._reported:
                self._reported.add(err)
                self.errors.append(err)
        return guests

    @property
    def kvm_guests(self) -> list[Guest]:
        """Running guests accelerated by KVM (TCG guests never halt-poll in the kernel)."""
        return [g for g in self.guests if g.virt_type == "kvm"]

    @property
    def guest_vcpus(self) -> int:
        return sum(g.vcpus or 1 for g in self.guests)

    @property
    def guest_memory_kib(self) -> int:
        return sum(g.memory_kib or QEMU_DEFAULT_MEMORY_KIB for g in self.guests)

    @property
    def vcpu_ratio(self) -> float | None:
        return self.guest_vcpus / self.cpu_count if self.cpu_count else None

    @property
    def memory_ratio(self) -> float | None:
        total = self.mem_total_kib
        return self.guest_memory_kib / total if total else None

    @cached_property
    def ksmd(self) -> PidStat | None:
        """The ``ksmd`` kernel thread (its CPU time shows what KSM costs)."""
        if self.ksm is None:
            return None
        pids = sorted(int(p) for p in self.host.listdir("/proc") if p.isdigit())
        for pid in pids:
            comm = self.host.read_optional(f"/proc/{pid}/comm")
            if comm is not None and comm.strip() == "ksmd":
                return self.parsed(f"/proc/{pid}/stat", parse_pid_stat, quiet=True)
        return None

    def ksmd_cpu_percent(self) -> float | None:
        """ksmd's share of one CPU since it started, in percent."""
        stat, uptime = self.ksmd, self.uptime
        if stat is None or uptime is None:
            return None
        alive = uptime - stat.starttime / self.clock_ticks
        if alive <= 0:
            return None
        return 100.0 * (stat.utime + stat.stime) / self.clock_ticks / alive

    # -- CPU power, isolation, interrupts, IOMMU -----------------------------------------------

    def _per_cpu(self, leaf: str) -> dict[int, str]:
        """``/sys/devices/system/cpu/cpuN/<leaf>`` for every online CPU that has it."""
        out: dict[int, str] = {}
        for cpu in sorted(self.online_cpus or ()):
            text = self.text(f"/sys/devices/system/cpu/cpu{cpu}/{leaf}", quiet=True)
            if text is not None and text.strip():
                out[cpu] = text.strip()
        return out

    @cached_property
    def cpu_governors(self) -> dict[int, str]:
        """The cpufreq governor per online CPU (empty where the kernel has no cpufreq driver, e.g. in a VM)."""
        return self._per_cpu("cpufreq/scaling_governor")

    @cached_property
    def energy_perf_bias(self) -> dict[int, int]:
        """Intel's ENERGY_PERF_BIAS per CPU: 0 = performance … 15 = power saving."""
        out: dict[int, int] = {}
        for cpu, text in self._per_cpu("power/energy_perf_bias").items():
            try:
                out[cpu] = int(text)
            except ValueError:
                self.problem(f"/sys/devices/system/cpu/cpu{cpu}/power/energy_perf_bias", "not a number")
        return out

    @cached_property
    def cpuidle_states(self) -> list[IdleState]:
        """CPU 0's idle states (the kernel offers the same set on every CPU)."""
        base = "/sys/devices/system/cpu/cpu0/cpuidle"
        out: list[IdleState] = []
        for entry in sorted(self.host.listdir(base), key=lambda e: (len(e), e)):
            if not re.fullmatch(r"state\d+", entry):
                continue
            name = (self.text(f"{base}/{entry}/name", quiet=True) or "").strip()
            latency = self.integer(f"{base}/{entry}/latency", quiet=True)
            disabled = self.integer(f"{base}/{entry}/disable", quiet=True)
            if latency is not None:
                out.append(IdleState(entry, name, latency, bool(disabled)))
        return out

    def cmdline_cpus(self, *params: str) -> set[int]:
        """The CPUs named by kernel parameters such as ``isolcpus=managed_irq,domain,2-7`` (flags dropped)."""
        cpus: set[int] = set()
        for param in params:
            value = self.kernel_cmdline.get(param, "")
            words = [w for w in value.split(",") if w and (w[0].isdigit())]
            try:
                cpus |= parse_cpu_list(",".join(words))
            except ValueError:
                self.problem("/proc/cmdline", f"{param}: not a CPU list")
        return cpus

    @cached_property
    def qemu_pids(self) -> list[int]:
        """QEMU processes under /proc (the same test as :attr:`guests`)."""
        out: list[int] = []
        for entry in self.host.listdir("/proc"):
            if not entry.isdigit():
                continue
            data = self.host.read_bytes(f"/proc/{entry}/cmdline", limit=4096)
            argv0 = data.split(b"\0", 1)[0].decode("utf-8", "replace") if data else ""
            if not argv0 or not is_qemu_binary(argv0):
                continue
            if self.host.is_live:  # argv[0] is chosen by whoever started the process; the executable is not
                exe = self.host.readlink(f"/proc/{entry}/exe")
                if exe is None or not is_qemu_binary(exe.removesuffix(" (deleted)")):
                    continue
            out.append(int(entry))
        return sorted(out)

    @cached_property
    def pinned_guest_cpus(self) -> dict[int, set[int]]:
        """Per QEMU process, the CPUs its restricted threads may run on (only processes with such threads):
        libvirt's ``<vcpupin>``/``<emulatorpin>`` and ``taskset`` show up as a ``Cpus_allowed_list``
        smaller than the online CPUs."""
        online = self.online_cpus or set()
        out: dict[int, set[int]] = {}
        for pid in self.qemu_pids:
            pinned: set[int] = set()
            for tid in self.host.listdir(f"/proc/{pid}/task"):
                status = self.host.read_optional(f"/proc/{pid}/task/{tid}/status") or ""
                m = re.search(r"^Cpus_allowed_list:\s*(\S+)", status, flags=re.M)
                if not m:
                    continue
                try:
                    allowed = parse_cpu_list(m.group(1))
                except ValueError:
                    continue
                if allowed and online and allowed & online != online:
                    pinned |= allowed
            if pinned:
                out[pid] = pinned
        return out

    @property
    def pinned_cpus(self) -> set[int]:
        return set().union(*self.pinned_guest_cpus.values()) if self.pinned_guest_cpus else set()

    def process_running(self, comm: str) -> bool:
        """Is a process with this ``comm`` (e.g. ``irqbalance``, ``tuned``) running?"""
        return comm in self.process_names

    @cached_property
    def process_names(self) -> set[str]:
        names: set[str] = set()
        for entry in self.host.listdir("/proc"):
            if entry.isdigit():
                comm = self.host.read_optional(f"/proc/{entry}/comm")
                if comm:
                    names.add(comm.strip())
        return names

    @cached_property
    def irq_affinity(self) -> dict[str, set[int]]:
        """Each interrupt's ``smp_affinity_list`` (the CPUs it may be delivered to)."""
        out: dict[str, set[int]] = {}
        for irq in self.host.listdir("/proc/irq"):
            if irq.isdigit():
                cpus = self.parsed(f"/proc/irq/{irq}/smp_affinity_list", parse_cpu_list, quiet=True)
                if cpus:
                    out[irq] = cpus
        return out

    @cached_property
    def iommu_groups(self) -> dict[str, str]:
        """IOMMU group → its default domain type (``DMA``, ``DMA-FQ``, ``identity``; ``""`` before 5.11)."""
        out: dict[str, str] = {}
        for group in self.host.listdir("/sys/kernel/iommu_groups"):
            if group.isdigit():
                out[group] = (self.text(f"/sys/kernel/iommu_groups/{group}/type", quiet=True) or "").strip()
        return out

    # -- configuration ------------------------------------------------------------------------

    @cached_property
    def tuned_profile(self) -> str | None:
        text = self.text("/etc/tuned/active_profile", quiet=True)
        return text.strip() or None if text is not None else None

    # -- Proxmox VE and ZFS --------------------------------------------------------------

    @cached_property
    def pve_node(self) -> bool:
        """A Proxmox VE node: its cluster file system, ``/etc/pve``, is there."""
        return self.host.is_dir("/etc/pve")

    @cached_property
    def pve_firewall_enabled(self) -> bool:
        """The datacenter firewall is on (``/etc/pve/firewall/cluster.fw``; absent: off, PVE's default)."""
        text = self.text("/etc/pve/firewall/cluster.fw")
        return parse_pve_firewall_enable(text) if text is not None else False

    @cached_property
    def ksmtuned_thres_coef(self) -> int:
        """ksmtuned's ``KSM_THRES_COEF`` (``/etc/ksmtuned.conf``; unset or unreadable: 20, PVE's default):
        ksmtuned runs KSM while less than this share of RAM (in %) is free to it (MemFree + Buffers + Cached), or
        while the QEMU processes' memory plus this share exceeds RAM."""
        text = self.text("/etc/ksmtuned.conf", quiet=True) or ""
        value = KSMTUNED_THRES_COEF_DEFAULT
        for line in text.splitlines():
            m = re.fullmatch(r"\s*KSM_THRES_COEF=[\"']?([0-9]{1,2})[\"']?\s*(#.*)?", line)
            if m:
                value = int(m.group(1))  # the file is sourced by a shell: the last assignment counts
        return value

    def ksmtuned_manages_ksm(self) -> bool:
        """On a Proxmox VE node with ksmtuned running, ksmtuned starts and stops KSM itself."""
        return self.pve_node and self.process_running("ksmtuned")

    @cached_property
    def zfs_arc(self) -> ZfsArc | None:
        """The ZFS ARC, where the zfs module is loaded."""
        return self.parsed("/proc/spl/kstat/zfs/arcstats", parse_arcstats)

    def load_all(self) -> None:
        """Read every fact (used by ``kvmtune capture-host``)."""
        for name in (
            "kernel_release", "online_cpus", "cpu_flags", "numa_nodes", "cpu_times", "uptime", "kernel_cmdline",
            "meminfo", "hugepages_reserved", "swaps", "ksm", "thp", "sysctl_settings", "kvm_loaded", "entropy_avail",
            "entropy_poolsize", "block_devices", "mounts", "net_devices", "softnet", "guests", "ksmd",
            "tuned_profile", "cpu_governors", "energy_perf_bias", "cpuidle_states", "pinned_guest_cpus",
            "process_names", "irq_affinity", "iommu_groups", "pve_node", "pve_firewall_enabled", "zfs_arc",
            "ksmtuned_thres_coef",
        ):
            getattr(self, name)
        for dev in self.net_devices.values():
            for q in dev.rx_queues:
                self.rps_mask(dev.name, q)
        for dev_path in ("/dev/kvm", "/dev/vhost-net", "/dev/net/tun"):
            self.device_exists(dev_path)
        self.module_param("kvm", "halt_poll_ns")

