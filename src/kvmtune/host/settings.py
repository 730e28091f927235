"""The host settings kvmtune wants: one table that the host rules check and ``fix --host`` sets.

Each :class:`Setting` says how its value is read (through :class:`HostFacts`),
what value it wants given the host (``want(facts, current)``: ``None`` = the
current value is fine), why, which rules' findings it answers, and how the value
lasts across reboots. A profile (``virtual-host``, ``network-throughput``, …) is
a selection of these. The rules import their thresholds and decisions from here,
the host planner (:mod:`kvmtune.fix.host`) writes what ``want`` asks for, so a
finding and its fix cannot disagree about the value (the contract test in
``tests/fix/test_remedies.py`` checks that every finding a profile answers is
gone after ``fix --host --profile P --apply`` on every fixture tree).

Per-device settings (I/O scheduler, tap txqueuelen, RPS masks) and the kvm
module parameter are planned device by device; their wanted values are the
functions at the end of this module, and :data:`DEVICE_SETTINGS` lists them in
the table.

Values come from today's tuned profiles and kernel documentation, not from the
2012 seeds where they differ (``tcp_tw_reuse`` goes back to 2, ``txqueuelen`` is
raised only where taps drop).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from kvmtune.host.facts import BlockDevice, HostFacts, NetDevice
from kvmtune.host.parsers import parse_bracket_choice

Want = Callable[[HostFacts, str], "str | None"]

PROFILES = ("virtual-host", "network-throughput", "network-latency", "storage")
NETWORK_PROFILES = ("virtual-host", "network-throughput", "network-latency")

# --------------------------------------------------------------------------- thresholds shared by rules and fixes

SWAPPINESS = 10  # tuned throughput-performance (included by virtual-host)
BACKLOG = 10_000  # Documentation/networking/scaling.rst: "1000 or 10000 performed well in experiments"
TCP_BUFFER_MAX = 16 * 1024 * 1024  # tuned network-throughput: tcp_rmem/tcp_wmem maximum 16777216
TCP_RMEM = (4096, 131072, TCP_BUFFER_MAX)
TCP_WMEM = (4096, 16384, TCP_BUFFER_MAX)
NOTSENT_LOWAT = 131_072  # tuned network-throughput
FAST_NIC_MBPS = 10_000  # a host with a NIC this fast needs the larger TCP buffers
VERY_FAST_NIC_MBPS = 40_000  # tuned: slow_start_after_idle/notsent_lowat matter on "40G+ networks"
TSQ_LOW = 262_144  # tcp_limit_output_bytes below this starves fast flows (seed 002 used 131072)
TSQ_DEFAULT = 1_048_576  # the kernel default since 4.x
TCP_LOW_LATENCY_GONE = (4, 14)  # tcp_low_latency does nothing from this kernel on
KSM_NOT_OVERCOMMITTED = 0.9  # guests' memory below 90 % of RAM: KSM buys nothing the host needs
PVE_KSMTUNED_START = 0.8  # PVE's ksmtuned (KSM_THRES_COEF=20) starts KSM once less than 20 % of RAM is free
ZFS_ARC_GUEST_SHARE = 0.95  # guests' memory + the ARC's maximum above 95 % of RAM: they fight over it
KERNEL_HALT_POLL_NS = 200_000  # KVM_HALT_POLL_NS_DEFAULT on x86
SEED_HALT_POLL_NS = 80_000  # seed 002
TAP_QLEN = 2500  # seed 002's best value; raised only on taps that drop

# tuned profiles that ask for low latency (each includes latency-performance or partitions CPUs)
LATENCY_TUNED_PROFILES = frozenset({
    "latency-performance", "network-latency", "realtime", "realtime-virtual-host", "realtime-virtual-guest",
    "cpu-partitioning",
})
DEEP_CSTATE_US = 3  # tuned latency-performance: force_latency=cstate.id_no_zero:1|3 (C1, else 3 µs)
GOVERNOR = "performance"  # tuned throughput-performance / latency-performance [cpu] governor
EPB_PERFORMANCE = 0  # energy_perf_bias=performance (0 of 0-15)
IRQBALANCE_CONFIGS = ("/etc/sysconfig/irqbalance", "/etc/default/irqbalance")

# I/O scheduler per device kind: what today's practice accepts (blk-mq names), and what a fix sets
SCHED_GOOD = {
    "nvme": {"none", "kyber"},
    "ssd": {"mq-deadline", "none", "kyber"},
    "hdd": {"mq-deadline", "bfq"},
    "virtual": {"none", "mq-deadline"},
}
# single-queue kernels (before 5.0, e.g. RHEL 6/7) offer the seeds' names
SCHED_GOOD_LEGACY = {"nvme": {"noop", "deadline"}, "ssd": {"noop", "deadline"}, "hdd": {"deadline"},
                     "virtual": {"noop", "deadline"}}
SCHED_WANT = {"nvme": "none", "virtual": "none", "ssd": "mq-deadline", "hdd": "mq-deadline"}
SCHED_WANT_LEGACY = {"nvme": "noop", "virtual": "noop", "ssd": "deadline", "hdd": "deadline"}


def fast_nics(facts: HostFacts, mbps: int = FAST_NIC_MBPS) -> list[NetDevice]:
    """Physical NICs at ``mbps`` or faster, by name."""
    return sorted(
        (d for d in facts.net_devices.values() if d.kind == "physical" and (d.speed_mbps or 0) >= mbps),
        key=lambda d: d.name,
    )


# --------------------------------------------------------------------------- wanted-value builders


def normalise(text: str) -> str:
    return " ".join(text.split())


def eq(value: str) -> Want:
    return lambda _f, cur: None if normalise(cur) == value else value


def at_least(value: int) -> Want:
    def want(_f: HostFacts, cur: str) -> str | None:
        try:
            return None if int(cur) >= value else str(value)
        except ValueError:
            return str(value)

    return want


def each_at_least(values: tuple[int, ...]) -> Want:
    def want(_f: HostFacts, cur: str) -> str | None:
        try:
            now = [int(x) for x in cur.split()]
        except ValueError:
            now = []
        if len(now) != len(values):
            return " ".join(map(str, values))
        merged = [max(a, b) for a, b in zip(now, values, strict=True)]
        return None if merged == now else " ".join(map(str, merged))

    return want


def at_most(value: int) -> Want:
    def want(_f: HostFacts, cur: str) -> str | None:
        try:
            return None if int(cur) <= value else str(value)
        except ValueError:
            return None

    return want


def replace(bad: tuple[str, ...], value: str) -> Want:
    return lambda _f, cur: value if normalise(cur) in bad else None


def nonzero_to(value: str) -> Want:
    return lambda _f, cur: value if normalise(cur) not in ("0", "") else None


def when(condition: Callable[[HostFacts], bool], want: Want) -> Want:
    """``want`` only on hosts where ``condition`` holds (e.g. a fast NIC is present)."""
    return lambda f, cur: want(f, cur) if condition(f) else None


def _int(cur: str) -> int | None:
    try:
        return int(cur)
    except ValueError:
        return None


def backlog_want(facts: HostFacts, cur: str) -> str | None:
    """10000 when full backlogs drop packets below it, and back to 10000 when raised beyond it for nothing."""
    value = _int(cur)
    if value is None or facts.softnet is None:
        return None
    dropped = sum(c.dropped for c in facts.softnet)
    if (dropped > 0 and value < BACKLOG) or (dropped == 0 and value > BACKLOG):
        return str(BACKLOG)
    return None


def tsq_want(_f: HostFacts, cur: str) -> str | None:
    value = _int(cur)
    return str(TSQ_DEFAULT) if value is not None and value < TSQ_LOW else None


def low_latency_want(facts: HostFacts, cur: str) -> str | None:
    return "0" if normalise(cur) == "1" and (facts.kernel_version or (0, 0)) >= TCP_LOW_LATENCY_GONE else None


def reno_want(facts: HostFacts, cur: str) -> str | None:
    return "cubic" if normalise(cur) == "reno" else None


def ksm_run_want(facts: HostFacts, cur: str) -> str | None:
    """KSM on while guests' memory exceeds RAM, off while they use well under it; never on a Proxmox VE node whose
    ksmtuned runs (it starts and stops KSM itself: a value written here lasts until its next check)."""
    ratio = facts.memory_ratio
    if ratio is None or facts.ksmtuned_manages_ksm():
        return None
    if ratio > 1.0 and normalise(cur) != "1":
        return "1"
    if normalise(cur) == "1" and facts.guests and ratio < KSM_NOT_OVERCOMMITTED:
        return "0"
    return None


def thp_enabled_want(_f: HostFacts, cur: str) -> str | None:
    return "madvise" if cur == "never" else None  # QEMU madvises guest RAM


def thp_defrag_want(_f: HostFacts, cur: str) -> str | None:
    return "madvise" if cur == "always" else None  # the kernel default since 4.6


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Setting:
    """One host value: where it is read, what is wanted, why, which findings it answers."""

    name: str  # a sysctl key, or a dotted name for a sysfs value (ksm.run, thp.defrag)
    want: Want
    why: str
    rules: tuple[str, ...] = ()  # the rules whose findings on this value it answers
    sysfs: Callable[[HostFacts], str | None] | None = None  # the file, for non-sysctl values
    target: str = ""  # the finding target it answers (default sysctl:<name>)
    bracket: bool = False  # a multiple-choice file: the [selected] word is the value
    couple: str | None = None  # a sysctl the kernel zeroes when this one is written (dirty_ratio/dirty_bytes)
    absent_ok: bool = False  # gone from the kernel is as good as the wanted value

    @property
    def is_sysctl(self) -> bool:
        return self.sysfs is None

    @property
    def finding_target(self) -> str:
        return self.target or f"sysctl:{self.name}"

    def path(self, facts: HostFacts) -> str | None:
        """The host path of the runtime value, or ``None`` if this host has no such value."""
        if self.sysfs is not None:
            return self.sysfs(facts)
        return HostFacts.sysctl_path(self.name)

    def current(self, facts: HostFacts) -> str | None:
        if self.sysfs is None:
            return facts.sysctl(self.name)
        path = self.sysfs(facts)
        text = facts.text(path, quiet=True) if path is not None else None
        if text is None:
            return None
        if self.bracket:
            try:
                return parse_bracket_choice(text).current
            except ValueError:
                return None
        return normalise(text)

    def choices(self, facts: HostFacts) -> tuple[str, ...] | None:
        """The values a multiple-choice file offers (``None`` for free-form values)."""
        path = self.path(facts)
        if not self.bracket or path is None:
            return None
        text = facts.text(path, quiet=True)
        try:
            return parse_bracket_choice(text).options if text is not None else None
        except ValueError:
            return None


KSM_RUN = "/sys/kernel/mm/ksm/run"


def _ksm(_f: HostFacts) -> str | None:
    return KSM_RUN


def _thp(leaf: str) -> Callable[[HostFacts], str | None]:
    return lambda f: f"{f.thp.base}/{leaf}" if f.thp is not None else None


def _guests_pinned(f: HostFacts) -> bool:
    return bool(f.pinned_guest_cpus)


def _fast(f: HostFacts) -> bool:
    return bool(fast_nics(f))


def _very_fast(f: HostFacts) -> bool:
    return bool(fast_nics(f, VERY_FAST_NIC_MBPS))


MEMORY = (
    Setting("vm.swappiness", eq(str(SWAPPINESS)), "tuned virtual-host: keep guest memory in RAM rather than swap",
            rules=("KVM-HST-010",)),
    Setting("vm.dirty_ratio", eq("40"), "tuned virtual-host (dirty_bytes = 40%)", couple="vm.dirty_bytes"),
    Setting("vm.dirty_background_ratio", eq("5"), "tuned virtual-host (dirty_background_bytes = 5%): write back early",
            couple="vm.dirty_background_bytes"),
    Setting("ksm.run", ksm_run_want, "KSM while guests' memory exceeds RAM, not while it buys nothing",
            rules=("KVM-HST-005", "KVM-HST-006"), sysfs=_ksm, target="ksm"),
    Setting("thp.enabled", thp_enabled_want, "QEMU asks for huge pages with madvise; never refuses them",
            rules=("KVM-HST-008",), sysfs=_thp("enabled"), target="thp:enabled", bracket=True),
    Setting("vm.zone_reclaim_mode", eq("0"),
            "kernel default since 3.16 (commit 4f9b16a6): reclaiming locally before using another node stalls guests",
            rules=("KVM-HST-043",)),
    Setting("thp.defrag", thp_defrag_want, "synchronous compaction on every fault stalls guests",
            rules=("KVM-HST-008",), sysfs=_thp("defrag"), target="thp:defrag", bracket=True),
)
NETWORK = (
    Setting("net.core.somaxconn", at_least(2048), "tuned throughput-performance: somaxconn >= 2048"),
    Setting("net.ipv4.tcp_tw_reuse", replace(("1",), "2"),
            "ip-sysctl.rst: leave at 2 (loopback only); seed 002's 1 reuses TIME-WAIT sockets for every peer",
            rules=("KVM-HST-012",)),
    Setting("net.ipv4.tcp_tw_recycle", nonzero_to("0"), "gone since Linux 4.12; it dropped clients behind NAT",
            rules=("KVM-HST-012",), absent_ok=True),
    Setting("net.ipv4.tcp_low_latency", low_latency_want, "does nothing since Linux 4.14: back to the default",
            rules=("KVM-HST-012",), absent_ok=True),
    Setting("net.ipv4.tcp_limit_output_bytes", tsq_want,
            "TCP Small Queues: the kernel default (1 MiB) lets fast flows keep the link busy", rules=("KVM-HST-012",)),
    Setting("net.ipv4.tcp_congestion_control", reno_want, "cubic, the default since 2.6.19", rules=("KVM-HST-012",)),
    Setting("net.core.netdev_max_backlog", backlog_want,
            "scaling.rst: 10000 when /proc/net/softnet_stat shows drops, not more without them",
            rules=("KVM-HST-023",)),
)
# the TCP buffers a host with a 10G+ NIC needs in every network profile (network-throughput sets them always)
FAST_NIC = (
    Setting("net.ipv4.tcp_rmem", when(_fast, each_at_least(TCP_RMEM)), "a 10G+ NIC: tuned network-throughput's 16 MiB",
            rules=("KVM-HST-013",)),
    Setting("net.ipv4.tcp_wmem", when(_fast, each_at_least(TCP_WMEM)), "a 10G+ NIC: tuned network-throughput's 16 MiB",
            rules=("KVM-HST-013",)),
    Setting("net.ipv4.tcp_notsent_lowat", when(_very_fast, at_most(NOTSENT_LOWAT)),
            "a 40G+ NIC: tuned network-throughput", rules=("KVM-HST-013",)),
    Setting("net.ipv4.tcp_slow_start_after_idle", when(_very_fast, eq("0")), "a 40G+ NIC: tuned network-throughput",
            rules=("KVM-HST-013",)),
)
THROUGHPUT = (
    Setting("net.ipv4.tcp_rmem", each_at_least(TCP_RMEM), "tuned network-throughput: 16 MiB maximum",
            rules=("KVM-HST-013",)),
    Setting("net.ipv4.tcp_wmem", each_at_least(TCP_WMEM), "tuned network-throughput: 16 MiB maximum",
            rules=("KVM-HST-013",)),
    Setting("net.ipv4.tcp_notsent_lowat", eq(str(NOTSENT_LOWAT)), "tuned network-throughput", rules=("KVM-HST-013",)),
    Setting("net.ipv4.tcp_slow_start_after_idle", eq("0"), "tuned network-throughput", rules=("KVM-HST-013",)),
)
LATENCY = (
    Setting("net.core.busy_read", eq("50"), "tuned network-latency: busy-poll sockets for 50 µs"),
    Setting("net.core.busy_poll", eq("50"), "tuned network-latency"),
    Setting("net.ipv4.tcp_fastopen", eq("3"), "tuned network-latency"),
    Setting("kernel.numa_balancing", eq("0"), "tuned network-latency: no NUMA page migration stalls",
            rules=("KVM-HST-042",)),
    Setting("kernel.timer_migration", eq("0"), "tuned network-latency"),
    Setting("vm.stat_interval", eq("10"), "tuned network-latency: fewer vmstat wake-ups"),
)


# guests pinned to CPUs (and their memory, numatune) are placed already: the balancer only migrates their pages
PINNED = (
    Setting("kernel.numa_balancing", when(_guests_pinned, eq("0")),
            "guests pinned with <vcpupin>/<numatune> are placed already: scanning them only faults and migrates pages",
            rules=("KVM-HST-042",)),
)


@dataclass(frozen=True)
class Profile:
    name: str
    settings: tuple[Setting, ...]
    network: bool  # taps, RPS: the per-device network settings
    summary: str


PROFILE_DEFS = {
    "virtual-host": Profile("virtual-host", MEMORY + PINNED + NETWORK + FAST_NIC, True, "tuned virtual-host for a KVM host"),
    "network-throughput": Profile(
        "network-throughput", MEMORY + PINNED + NETWORK + THROUGHPUT, True, "virtual-host plus tuned network-throughput"
    ),
    "network-latency": Profile(
        "network-latency", MEMORY + NETWORK + FAST_NIC + LATENCY, True,
        "virtual-host plus tuned network-latency's sysctls (not its THP=never or dirty 10/3, which hurt guests)",
    ),
    "storage": Profile("storage", MEMORY + PINNED, False, "virtual-host's memory settings and I/O schedulers"),
}


@dataclass(frozen=True)
class DeviceSetting:
    """A value planned device by device (its wanted value: the functions below)."""

    name: str
    rules: tuple[str, ...]
    target_prefix: str  # the finding targets it answers start with this
    profiles: tuple[str, ...]
    persist: str  # the drop-in that makes it last


DEVICE_SETTINGS = (
    DeviceSetting("block scheduler", ("KVM-HST-004",), "block:", PROFILES, "udev"),
    DeviceSetting("kvm halt_poll_ns", ("KVM-HST-011",), "kvm:halt_poll_ns", PROFILES, "modprobe"),
    DeviceSetting("tap txqueuelen", ("KVM-HST-015",), "net:", NETWORK_PROFILES, "udev"),
    DeviceSetting("rps_cpus", ("KVM-HST-016",), "net:", NETWORK_PROFILES, "udev"),
    DeviceSetting("kernel command line iommu=pt", ("KVM-HST-047",), "iommu", PROFILES, "cmdline"),
)


def answers(rule_id: str, target: str | None, profile: str) -> bool:
    """Does ``fix --host --profile profile`` set the value this finding is about?"""
    for s in PROFILE_DEFS[profile].settings:
        if rule_id in s.rules and target == s.finding_target:
            return True
    return any(
        rule_id in d.rules and profile in d.profiles and (target or "").startswith(d.target_prefix)
        for d in DEVICE_SETTINGS
    )


# the per-device runtime values fix --host writes (kvmtune.fix.host), as host paths
_DEVICE_PATHS = (
    re.compile(r"/sys/block/[^/]+/queue/scheduler"),
    re.compile(r"/sys/class/net/[^/]+/tx_queue_len"),
    re.compile(r"/sys/class/net/[^/]+/queues/rx-0/rps_cpus"),
    re.compile(r"/sys/module/kvm/parameters/halt_poll_ns"),
)
_THP_BASES = ("/sys/kernel/mm/transparent_hugepage", "/sys/kernel/mm/redhat_transparent_hugepage")


def runtime_paths() -> set[str]:
    """The /proc/sys and /sys files of the table's settings (every profile's, and the sysctls they are coupled
    with), on any host: the only values besides :data:`_DEVICE_PATHS` that ``kvmtune undo`` writes back."""
    out = {KSM_RUN}
    out |= {f"{base}/{leaf}" for base in _THP_BASES for leaf in ("enabled", "defrag")}
    for profile in PROFILE_DEFS.values():
        for s in profile.settings:
            if s.is_sysctl:
                out.add(HostFacts.sysctl_path(s.name))
            if s.couple:
                out.add(HostFacts.sysctl_path(s.couple))
    return out


def known_runtime_path(host_path: str) -> bool:
    """Is ``host_path`` a runtime value the settings table sets (a sysctl, KSM, THP, or a device value)?"""
    if any(part in ("", ".", "..") for part in host_path.split("/")[1:]):
        return False
    return host_path in runtime_paths() or any(p.fullmatch(host_path) for p in _DEVICE_PATHS)


def host_fixed_rules() -> set[str]:
    """Every rule some host setting answers."""
    out = {r for p in PROFILE_DEFS.values() for s in p.settings for r in s.rules}
    return out | {r for d in DEVICE_SETTINGS for r in d.rules}


# --------------------------------------------------------------------------- per-device wanted values


def scheduler_ok(dev: BlockDevice) -> bool:
    return dev.scheduler in (SCHED_GOOD_LEGACY if dev.legacy else SCHED_GOOD).get(dev.kind, set())


def scheduler_want(dev: BlockDevice) -> str | None:
    """The scheduler to set, or ``None`` if the current one suits the device."""
    if scheduler_ok(dev):
        return None
    return (SCHED_WANT_LEGACY if dev.legacy else SCHED_WANT).get(dev.kind)


def halt_poll_want(facts: HostFacts, value: int, *, latency_profile: bool = False) -> tuple[int, str] | None:
    """The halt_poll_ns to set and why, or ``None`` if ``value`` suits how loaded the CPUs are."""
    cpus = facts.cpu_count
    ratio = facts.guest_vcpus / cpus if cpus else None  # every running vCPU competes for the CPUs
    polling = bool(facts.kvm_guests)  # only KVM vCPUs halt-poll
    if ratio is not None and ratio > 1.0 and value > 0 and polling:
        return 0, f"vCPUs outnumber CPUs ({ratio:.1f}:1): polling takes CPU from runnable vCPUs"
    if (ratio is None or ratio <= 1.0) and value == 0 and (polling or latency_profile):
        return KERNEL_HALT_POLL_NS, "off although CPUs are spare (seed 002: +35% on small transactions)"
    if value > KERNEL_HALT_POLL_NS:
        return KERNEL_HALT_POLL_NS, "above the kernel default: idle vCPUs burn host CPU"
    return None


def tap_qlen_want(dev: NetDevice) -> int | None:
    """A tap or macvtap that drops on transmit gets seed 002's longer queue."""
    if dev.kind not in ("tap", "macvtap") or dev.tx_queue_len is None:
        return None
    if dev.tx_dropped and dev.tx_queue_len < TAP_QLEN:
        return TAP_QLEN
    return None


def rps_want(facts: HostFacts, dev: NetDevice) -> set[int] | None:
    """CPUs to steer a single-queue NIC's receive work to (its NUMA node's, else all), or ``None``."""
    cpus = facts.online_cpus or set()
    if len(cpus) < 2 or dev.kind != "physical" or not dev.is_up or dev.rx_queues != ["rx-0"]:
        return None
    mask = facts.rps_mask(dev.name, "rx-0")
    if mask is None or mask:
        return None
    node_cpus = facts.numa_nodes.get(dev.numa_node, set()) if dev.numa_node is not None else set()
    return (node_cpus & cpus) or cpus


# the kernel command-line argument that keeps the host's own devices out of IOMMU translation (passthrough mode)
IOMMU_PT = "iommu=pt"
# GRUB's defaults, and the grub-mkconfig that reads them: Debian's and Ubuntu's (a shell script) also source
# /etc/default/grub.d/*.cfg, kvmtune's drop-in; Red Hat's grub2-mkconfig does not (a drop-in would be ignored)
GRUB_DEFAULTS = "/etc/default/grub"
GRUB_MKCONFIG = "/usr/sbin/grub-mkconfig"
MAX_MKCONFIG = 1 << 20


def grub_host(facts: HostFacts) -> bool:
    """Whether ``fix --host`` can put a kernel command-line argument in a GRUB drop-in here: /etc/default/grub
    exists and the host's grub-mkconfig sources /etc/default/grub.d (Debian's, Ubuntu's). Elsewhere (Red Hat's
    grub2-mkconfig and grubby's BLS entries, systemd-boot's /etc/kernel/cmdline) the argument is the operator's."""
    if facts.text(GRUB_DEFAULTS, quiet=True) is None:
        return False
    script = facts.text(GRUB_MKCONFIG, quiet=True)
    return script is not None and len(script) <= MAX_MKCONFIG and "/default/grub.d/" in script


def passthrough_guests(facts: HostFacts) -> list[str]:
    """The running guests with a device passed through (VFIO): the hosts the IOMMU rule looks at."""
    return [g.name for g in facts.guests if g.hostdevs]


def iommu_pt_want(facts: HostFacts) -> str | None:
    """``iommu=pt`` where guests have devices passed through, the IOMMU is on (its groups exist) and translates
    every device (no group of type 'identity', no ``iommu=pt``/``iommu.passthrough`` on the command line); None
    otherwise (also with the IOMMU off: turning it on, intel_iommu=on, is the operator's call)."""
    if not passthrough_guests(facts):
        return None
    groups = facts.iommu_groups
    if not groups or any(t == "identity" for t in groups.values()):
        return None
    cmdline = facts.kernel_cmdline
    if cmdline.get("iommu") == "pt" or cmdline.get("iommu.passthrough") in ("1", "on", "y"):
        return None
    return IOMMU_PT

