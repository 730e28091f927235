"""``kvmtune why``'s sampling: per tick, every host thread's CPU time and last CPU, the guest's vCPUs' run delay,
its vhost workers' schedstat and its cgroup's CPU quota and PSI counters, all read through the host root."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from kvmtune.host.parsers import parse_cpu_list, parse_flat_keyed, parse_psi_total
from kvmtune.host.root import HostRoot
from kvmtune.live.sources import parse_schedstat
from kvmtune.live.threads import Owner, Owners, ThreadStat, read_threads
from kvmtune.live.why.core import Target

# --- sampling ----------------------------------------------------------------------------------------


def _cpu_list(text: str | None) -> frozenset[int] | None:
    """A kernel CPU list (:func:`~kvmtune.host.parsers.parse_cpu_list`); None when empty or not one."""
    if not text:
        return None
    try:
        cpus = parse_cpu_list(text)
    except ValueError:
        return None
    return frozenset(cpus) or None


def allowed_cpus(host: HostRoot, pid: int, tid: int) -> frozenset[int] | None:
    for line in (host.read_optional(f"/proc/{pid}/task/{tid}/status") or "").splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return _cpu_list(line.split(":", 1)[1].strip())
    return None


def _cgroup_dir(host: HostRoot, pid: int, tid: int) -> str | None:
    """The cgroup v2 directory of a thread, None on cgroup v1 or in the root cgroup."""
    for line in (host.read_optional(f"/proc/{pid}/task/{tid}/cgroup") or "").splitlines():
        if line.startswith("0::"):
            path = line[3:].strip()
            return None if path in ("", "/") else f"/sys/fs/cgroup{path}"
    return None


@dataclass
class Vcpu:
    index: int
    tid: int
    allowed: frozenset[int] | None
    cpu_ns: int = 0
    delay_ns: int = 0
    waits: dict[int, int] = field(default_factory=dict)  # host CPU -> ns waited there


class Tracker:
    """What the ticks add up: per host CPU, each owner's use; per vCPU, where it waited."""

    def __init__(self, host: HostRoot, target: Target, vcpus: dict[int, int]) -> None:
        self.host = host
        self.pid = target.pid or 0
        self.owners = Owners(host)
        self.me = os.getpid() if host.is_live else -1  # kvmtune's own sampling is not a neighbour
        self.clk = os.sysconf("SC_CLK_TCK")
        self.vcpus = {tid: Vcpu(i, tid, allowed_cpus(host, self.pid, tid)) for i, tid in vcpus.items()}
        self.use: dict[int, dict[Owner, int]] = {}  # host CPU -> owner -> ns used
        self.own_use: dict[str, int] = {}  # the guest's own non-vCPU threads by name -> ns (I/O threads, main loop)
        self.sample_tid: dict[Owner, int] = {}
        self.own_vcpu_use: dict[int, int] = {}  # host CPU -> ns the guest's own vCPUs used there
        self.prev: dict[int, ThreadStat] = {}
        self.prev_sched: dict[int, tuple[int, int]] = {}
        self.cgroup = _cgroup_dir(host, self.pid, next(iter(vcpus.values()), self.pid)) if self.pid else None
        self.cg_start: dict[str, int] = {}
        self.cg_end: dict[str, int] = {}
        self.t0 = self.t1 = time.monotonic()
        self.vhost_comm = f"vhost-{self.pid}"
        self.vhost_first: dict[int, tuple[int, int]] = {}  # vhost worker tid -> schedstat when first seen
        self.vhost_last: dict[int, tuple[int, int]] = {}
        self.vhost_cpu: dict[int, int] = {}  # the CPU it last ran on
        # no vCPU thread known (unnamed threads, no QMP): every thread's schedstat at its first and last tick
        self.thread_first: dict[int, tuple[int, int]] = {}
        self.thread_last: dict[int, tuple[int, int]] = {}

    def _vhost(self, now: dict[int, ThreadStat]) -> None:
        """The guest's vhost workers' schedstat (kernel threads, or QEMU's own threads on Linux 6.4+)."""
        for t in now.values():
            if t.comm != self.vhost_comm:
                continue
            s = parse_schedstat(self.host.read_optional(f"/proc/{t.pid}/task/{t.tid}/schedstat") or "")
            if s is not None:
                self.vhost_first.setdefault(t.tid, s)
                self.vhost_last[t.tid] = s
                self.vhost_cpu[t.tid] = t.cpu

    def _all_threads(self, now: dict[int, ThreadStat]) -> None:
        for t in now.values():
            if t.pid != self.pid or t.comm == self.vhost_comm:
                continue
            s = parse_schedstat(self.host.read_optional(f"/proc/{t.pid}/task/{t.tid}/schedstat") or "")
            if s is not None:
                self.thread_first.setdefault(t.tid, s)
                self.thread_last[t.tid] = s

    def _cgroup_counters(self) -> dict[str, int]:
        if self.cgroup is None:
            return {}
        out = {f"cpu.{k}": v for k, v in parse_flat_keyed(self.host.read_optional(f"{self.cgroup}/cpu.stat")).items()}
        guest_dir = self.cgroup.rsplit("/", 1)[0] if self.cgroup.rsplit("/", 1)[-1].startswith("vcpu") else self.cgroup
        for resource in ("cpu", "io", "memory"):
            total = parse_psi_total(self.host.read_optional(f"{guest_dir}/{resource}.pressure"))
            if total is not None:
                out[f"psi.{resource}"] = total
        return out

    def tick(self) -> None:
        now = read_threads(self.host)
        sched = {tid: parse_schedstat(self.host.read_optional(f"/proc/{self.pid}/task/{tid}/schedstat") or "")
                 for tid in self.vcpus}
        self.t1 = time.monotonic()
        self._vhost(now)
        if not self.vcpus and self.pid:
            self._all_threads(now)
        if not self.prev:
            self.t0 = self.t1
            self.cg_start = self._cgroup_counters()
        else:
            self._account(now, sched)
            self.cg_end = self._cgroup_counters()
        self.prev = now
        self.prev_sched = {tid: s for tid, s in sched.items() if s is not None}

    def _account(self, now: dict[int, ThreadStat], sched: dict[int, tuple[int, int] | None]) -> None:
        for tid, t in now.items():
            before = self.prev.get(tid)
            if before is None or t.pid == self.me:
                continue
            used = (t.ticks - before.ticks) * 1_000_000_000 // self.clk
            if used <= 0:
                continue
            if tid in self.vcpus and t.pid == self.pid:  # not its own neighbour, but its vhost worker's
                self.own_vcpu_use[t.cpu] = self.own_vcpu_use.get(t.cpu, 0) + used
                continue
            owner = self.owners.owner(t)
            self.use.setdefault(t.cpu, {}).setdefault(owner, 0)
            self.use[t.cpu][owner] += used
            self.sample_tid.setdefault(owner, tid)
            if t.pid == self.pid and owner.kind != "vhost":
                self.own_use[t.comm] = self.own_use.get(t.comm, 0) + used
        for tid, v in self.vcpus.items():
            s, before_s = sched.get(tid), self.prev_sched.get(tid)
            if s is None or before_s is None:
                continue
            v.cpu_ns += s[0] - before_s[0]
            waited = s[1] - before_s[1]
            v.delay_ns += waited
            where = now[tid].cpu if tid in now else -1
            v.waits[where] = v.waits.get(where, 0) + waited

    @property
    def interval_ns(self) -> int:
        return max(1, int((self.t1 - self.t0) * 1e9))
