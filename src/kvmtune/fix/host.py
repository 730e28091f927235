"""Host profiles: drop-in files kvmtune owns, plus the runtime writes that make them take effect now.

Like tuned's plugins, reading (audit), applying and verifying share one code path:
the values are read through :class:`~kvmtune.host.facts.HostFacts` (what the host
rules read), each setting decides from the current value what it wants (``None`` =
the current value is fine), and applying twice plans nothing the second time.

Files kvmtune owns (all below ``--root``):

* ``/etc/sysctl.d/90-kvmtune.conf`` — sysctls
* ``/etc/udev/rules.d/90-kvmtune.rules`` — I/O scheduler per device kind, tap txqueuelen
* ``/etc/modprobe.d/kvmtune.conf`` — ``kvm halt_poll_ns``

A drop-in lists what this profile set now or what kvmtune's own file already set
(so the file stays the same once the values are in place). Values come from today's
tuned profiles and kernel documentation, not from the 2012 seeds where they differ
(``tcp_tw_reuse`` goes back to 2, ``txqueuelen`` is raised only where taps drop).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvmtune.fix import HOST_PROFILES
from kvmtune.fix.diff import Reason
from kvmtune.fix.files import read_state
from kvmtune.fix.plan import DropIn, Plan, SysfsWrite, normalise
from kvmtune.host.facts import HostFacts
from kvmtune.host.parsers import parse_sysctl_conf
from kvmtune.host.root import HostRoot

PROFILES = HOST_PROFILES
SYSCTL_DROPIN = "/etc/sysctl.d/90-kvmtune.conf"
UDEV_DROPIN = "/etc/udev/rules.d/90-kvmtune.rules"
MODPROBE_DROPIN = "/etc/modprobe.d/kvmtune.conf"
HALT_POLL = "/sys/module/kvm/parameters/halt_poll_ns"
KERNEL_HALT_POLL_NS = 200_000  # KVM_HALT_POLL_NS_DEFAULT on x86
TAP_QLEN = 2500  # seed 002's best value; raised only on taps that drop
BACKLOG = 10_000  # Documentation/networking/scaling.rst

Want = Callable[[HostFacts, str], "str | None"]


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


def replace(bad: tuple[str, ...], value: str) -> Want:
    return lambda _f, cur: value if normalise(cur) in bad else None


def nonzero_to(value: str) -> Want:
    return lambda _f, cur: value if normalise(cur) not in ("0", "") else None


def backlog(_f: HostFacts, cur: str) -> str | None:
    drops = sum(c.dropped for c in (_f.softnet or []))
    try:
        return str(BACKLOG) if drops > 0 and int(cur) < BACKLOG else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Sysctl:
    key: str
    want: Want
    why: str
    couple: str | None = None  # a sysctl the kernel zeroes when this one is written (dirty_ratio/dirty_bytes)

    @property
    def path(self) -> str:
        return "/proc/sys/" + self.key.replace(".", "/")


BASE = (
    Sysctl("vm.swappiness", eq("10"), "tuned virtual-host: keep guest memory in RAM rather than swap"),
    Sysctl("vm.dirty_ratio", eq("40"), "tuned virtual-host (dirty_bytes = 40%)", couple="vm.dirty_bytes"),
    Sysctl(
        "vm.dirty_background_ratio", eq("5"), "tuned virtual-host (dirty_background_bytes = 5%): write back early",
        couple="vm.dirty_background_bytes",
    ),
)
NET_BASE = (
    Sysctl("net.core.somaxconn", at_least(2048), "tuned throughput-performance: somaxconn >= 2048"),
    Sysctl(
        "net.ipv4.tcp_tw_reuse", replace(("1",), "2"),
        "ip-sysctl.rst: leave at 2 (loopback only); seed 002's 1 reuses TIME-WAIT sockets for every peer",
    ),
    Sysctl("net.ipv4.tcp_tw_recycle", nonzero_to("0"), "gone since Linux 4.12; it dropped clients behind NAT"),
)
THROUGHPUT = (
    Sysctl("net.ipv4.tcp_rmem", each_at_least((4096, 131072, 16777216)), "tuned network-throughput: 16 MiB maximum"),
    Sysctl("net.ipv4.tcp_wmem", each_at_least((4096, 16384, 16777216)), "tuned network-throughput: 16 MiB maximum"),
    Sysctl("net.ipv4.tcp_notsent_lowat", eq("131072"), "tuned network-throughput"),
    Sysctl("net.ipv4.tcp_slow_start_after_idle", eq("0"), "tuned network-throughput"),
    Sysctl("net.core.netdev_max_backlog", backlog, "scaling.rst: 10000 when /proc/net/softnet_stat shows drops"),
)
LATENCY = (
    Sysctl("net.core.busy_read", eq("50"), "tuned network-latency: busy-poll sockets for 50 µs"),
    Sysctl("net.core.busy_poll", eq("50"), "tuned network-latency"),
    Sysctl("net.ipv4.tcp_fastopen", eq("3"), "tuned network-latency"),
    Sysctl("kernel.numa_balancing", eq("0"), "tuned network-latency: no NUMA page migration stalls"),
    Sysctl("kernel.timer_migration", eq("0"), "tuned network-latency"),
    Sysctl("vm.stat_interval", eq("10"), "tuned network-latency: fewer vmstat wake-ups"),
)


@dataclass(frozen=True)
class Profile:
    name: str
    sysctls: tuple[Sysctl, ...]
    taps: bool
    summary: str


PROFILE_DEFS = {
    "virtual-host": Profile("virtual-host", BASE + NET_BASE, True, "tuned virtual-host for a KVM host"),
    "network-throughput": Profile(
        "network-throughput", BASE + NET_BASE + THROUGHPUT, True, "virtual-host plus tuned network-throughput"
    ),
    "network-latency": Profile(
        "network-latency", BASE + NET_BASE + LATENCY, True,
        "virtual-host plus tuned network-latency's sysctls (not its THP=never or dirty 10/3, which hurt guests)",
    ),
    "storage": Profile("storage", BASE, False, "virtual-host's memory settings and I/O schedulers"),
}

# I/O scheduler per device kind (blk-mq names); GOOD mirrors the io-scheduler rule (KVM-HST-004)
SCHED_WANT = {"nvme": "none", "virtual": "none", "ssd": "mq-deadline", "hdd": "mq-deadline"}
# single-queue kernels (before 5.0, e.g. RHEL 6/7) offer the seeds' names
SCHED_WANT_LEGACY = {"nvme": "noop", "virtual": "noop", "ssd": "deadline", "hdd": "deadline"}
SCHED_UDEV = {
    "nvme": 'KERNEL=="nvme[0-9]*n[0-9]*"',
    "virtual": 'KERNEL=="vd[a-z]*|xvd[a-z]*"',
    "hdd": 'KERNEL=="sd[a-z]*|hd[a-z]*", ATTR{queue/rotational}=="1"',
    "ssd": 'KERNEL=="sd[a-z]*", ATTR{queue/rotational}=="0"',
}
TAP_UDEV = 'ACTION=="add", SUBSYSTEM=="net", KERNEL=="vnet[0-9]*|macvtap[0-9]*", ATTR{tx_queue_len}="%d"'
_MARK = re.compile(r"^# kvmtune: (\S+) (\S+)")


def _good_schedulers(legacy: bool) -> dict[str, set[str]]:
    """What the io-scheduler rule (KVM-HST-004) accepts per device kind: the fix leaves those alone."""
    from kvmtune.rules.host.io_scheduler import GOOD, LEGACY_GOOD

    return {k: set(v) for k, v in (LEGACY_GOOD if legacy else GOOD).items()}


def _header(profile: str) -> list[str]:
    return [
        f"# Managed by kvmtune (kvmtune fix --host --profile {profile}).",
        "# 'kvmtune undo ID' restores what was here before; the next 'kvmtune fix --host' rewrites this file.",
    ]


class HostPlanner:
    def __init__(self, root: str, profile: str) -> None:
        if profile not in PROFILE_DEFS:
            raise ValueError(f"unknown profile {profile!r} (one of: {', '.join(PROFILES)})")
        self.root = Path(root)
        self.host = HostRoot(root)
        self.facts = HostFacts(self.host)
        self.profile = PROFILE_DEFS[profile]
        self.plan = Plan()
        self.runtime: list[SysfsWrite] = []

    def real(self, host_path: str) -> Path:
        return self.root / host_path.lstrip("/")

    def _own(self, host_path: str) -> str:
        try:
            data = read_state(self.real(host_path)).data
        except OSError:
            return ""
        return data.decode("utf-8", "replace") if data else ""

    def _write(self, path: str, cur: str, new: str, why: str, parse: str = "plain",
               restore: list[tuple[str, str]] | None = None) -> None:
        self.runtime.append(
            SysfsWrite(
                path=path, root=self.root, prior=cur, new=new, parse=parse,
                restore=restore or [(path, cur)],
                reasons=[Reason(f"{self.profile.name}: {why}")],
            )
        )

    # -- sysctl ---------------------------------------------------------------------------

    def sysctls(self) -> list[str]:
        own = {s.key: s.value for s in parse_sysctl_conf(self._own(SYSCTL_DROPIN), SYSCTL_DROPIN)}
        lines: list[str] = []
        for s in self.profile.sysctls:
            cur = self.facts.sysctl(s.key)
            if cur is None:
                if s.key in ("net.ipv4.tcp_tw_recycle",):
                    continue  # gone from the kernel, as it should be
                where = "not on this kernel" if self.host.is_live else "not in this host root"
                self.plan.skipped.append(f"{s.key}: {where} ({s.path} absent); left alone")
                continue
            want = s.want(self.facts, cur)
            if want is not None and normalise(want) != cur:
                restore = [(s.path, cur)]
                if s.couple:
                    other = self.facts.sysctl(s.couple)
                    if other not in (None, "0"):
                        restore = [("/proc/sys/" + s.couple.replace(".", "/"), other)]
                self._write(s.path, cur, want, f"{s.key} {cur} → {want} ({s.why})", restore=restore)
            keep = want if want is not None else own.get(s.key)
            if keep is not None:
                lines.append(f"{s.key} = {keep}")
                self._overridden(s.key, keep)
        return lines

    def _overridden(self, key: str, value: str) -> None:
        try:
            settings = self.facts.sysctl_settings
        except Exception:
            return
        ours = Path(SYSCTL_DROPIN).name
        for st in settings:
            if st.key != key or st.file == SYSCTL_DROPIN or st.value == value:
                continue
            if st.file == "/etc/sysctl.conf" or Path(st.file).name > ours:
                self.plan.notes.append(
                    f"{key}: {st.file}:{st.line} sets {st.value} and is read after {SYSCTL_DROPIN}; at boot it wins"
                )

    # -- halt polling ------------------------------------------------------------------------

    def halt_poll(self) -> list[str]:
        own = re.search(r"^options\s+kvm\s+.*\bhalt_poll_ns=(\d+)", self._own(MODPROBE_DROPIN), re.M)
        raw = self.facts.module_param("kvm", "halt_poll_ns")
        if raw is None:
            self.plan.skipped.append("kvm.halt_poll_ns: kvm is not loaded; left alone")
            return [f"options kvm halt_poll_ns={own.group(1)}"] if own else []
        try:
            cur = int(raw)
        except ValueError:
            self.plan.skipped.append(f"kvm.halt_poll_ns: {HALT_POLL} holds {raw!r}; left alone")
            return []
        ratio = self.facts.vcpu_ratio
        want: int | None = None
        if ratio is not None and ratio > 1.0 and cur > 0:
            want, why = 0, f"vCPUs outnumber CPUs ({ratio:.1f}:1): polling takes CPU from runnable vCPUs"
        elif cur > KERNEL_HALT_POLL_NS:
            want, why = KERNEL_HALT_POLL_NS, "above the kernel default: idle vCPUs burn host CPU"
        elif cur == 0 and (ratio is None or ratio <= 1.0) and (
            self.facts.guests or self.profile.name == "network-latency"
        ):
            want, why = KERNEL_HALT_POLL_NS, "off although CPUs are spare (seed 002: +35% on small transactions)"
        if want is not None:
            self._write(HALT_POLL, str(cur), str(want), f"kvm.halt_poll_ns {cur} → {want}: {why}")
        keep = str(want) if want is not None else (own.group(1) if own else None)
        return [f"options kvm halt_poll_ns={keep}"] if keep is not None else []

    # -- udev: schedulers and taps ------------------------------------------------------------------

    def udev(self) -> list[str]:
        marks = {(m.group(1), m.group(2)) for m in map(_MARK.match, self._own(UDEV_DROPIN).splitlines()) if m}
        kinds: set[str] = {k for what, k in marks if what == "scheduler"}
        names: dict[str, str] = dict(SCHED_WANT)
        devices = self.facts.block_devices
        for dev in devices:
            table = SCHED_WANT_LEGACY if dev.legacy else SCHED_WANT
            names[dev.kind] = table.get(dev.kind, names.get(dev.kind, ""))
            want = table.get(dev.kind)
            if want is None or dev.scheduler in _good_schedulers(dev.legacy).get(dev.kind, set()):
                continue
            if want not in dev.available:
                self.plan.skipped.append(f"block {dev.name}: {want} not offered ({', '.join(dev.available)})")
                continue
            self._write(
                f"/sys/block/{dev.name}/queue/scheduler", dev.scheduler, want,
                f"block {dev.name} ({dev.kind}): scheduler {dev.scheduler} → {want}", parse="bracket",
            )
            kinds.add(dev.kind)
        lines: list[str] = []
        for dev in devices:
            if dev.kind in kinds and dev.scheduler != names[dev.kind] and not any(
                w.path == f"/sys/block/{dev.name}/queue/scheduler" for w in self.runtime
            ):
                self.plan.notes.append(
                    f"block {dev.name}: keeps {dev.scheduler} now (fine for a {dev.kind}), but the udev rule "
                    f"sets {names[dev.kind]} on every {dev.kind} device when it appears (next boot)"
                )
        for kind in ("nvme", "virtual", "ssd", "hdd"):
            if kind in kinds:
                lines.append(f"# kvmtune: scheduler {kind}")
                lines.append(
                    f'ACTION=="add|change", SUBSYSTEM=="block", ENV{{DEVTYPE}}=="disk", {SCHED_UDEV[kind]}, '
                    f'ATTR{{queue/scheduler}}="{names[kind]}"'
                )
        if self.profile.taps:
            taps = ("txqueuelen", "taps") in marks
            for net in sorted(self.facts.net_devices.values(), key=lambda d: d.name):
                if net.kind not in ("tap", "macvtap") or net.tx_queue_len is None:
                    continue
                if net.tx_dropped and net.tx_queue_len < TAP_QLEN:
                    self._write(
                        f"/sys/class/net/{net.name}/tx_queue_len", str(net.tx_queue_len), str(TAP_QLEN),
                        f"{net.kind} {net.name}: txqueuelen {net.tx_queue_len} → {TAP_QLEN} "
                        f"({net.tx_dropped} packets dropped on transmit)",
                    )
                    taps = True
            if taps:
                lines.append("# kvmtune: txqueuelen taps")
                lines.append(TAP_UDEV % TAP_QLEN)
        return lines

    # -- the plan -------------------------------------------------------------------------------

    def _dropin(self, host_path: str, lines: list[str], why: str) -> None:
        real = self.real(host_path)
        try:
            before = read_state(real)
        except OSError as exc:
            self.plan.skipped.append(f"{host_path}: {exc}; left alone")
            return
        if not lines:
            return
        after = ("\n".join([*_header(self.profile.name), *lines]) + "\n").encode()
        if before.data == after:
            return
        self.plan.changes.append(DropIn(path=real, shown=host_path, before=before, after=after, reasons=[Reason(why)]))

    def build(self) -> Plan:
        sysctl_lines = self.sysctls()
        modprobe_lines = self.halt_poll()
        udev_lines = self.udev()
        self.plan.changes.extend(self.runtime)
        self._dropin(SYSCTL_DROPIN, sysctl_lines, "makes the sysctls last across reboots (systemd-sysctl)")
        self._dropin(UDEV_DROPIN, udev_lines, "sets the scheduler / txqueuelen again whenever a device appears")
        self._dropin(MODPROBE_DROPIN, modprobe_lines, "kvm module option, applied when kvm is loaded")
        self.plan.skipped.extend(self.facts.errors)
        return self.plan


def plan_host(root: str, profile: str) -> Plan:
    return HostPlanner(root, profile).build()
