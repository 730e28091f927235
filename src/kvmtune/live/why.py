"""``kvmtune why GUEST``: where one guest's time went while it was sampled, who took it, and which rule explains it.

The guest is sampled for a few seconds. Every tick reads every host thread's CPU time and the CPU it last
ran on (:mod:`.threads`), the guest's vCPU threads' run delay (``schedstat``) and its cgroup's CPU quota
counters; the sources ``top`` uses (:mod:`.sources`) read its disks, NICs and balloon at the start and the
end, and :class:`~kvmtune.live.diagnose.Diagnoser` ties the signals past their thresholds (``symptoms.SIGNALS``)
to the rules that explain them.

For a vCPU that waited, the wait is put on the CPU it was queued on and the other threads' use of that CPU
names who ran instead; the owner of the most of it decides the cause (another guest: pinning overlap or
overcommit; the guest's own QEMU threads: emulator threads on vCPU CPUs; a host process, by its command).
Every line names a rule id, or says plainly that no rule covers it.
"""

from __future__ import annotations

import os
import re
import stat
import time
from dataclasses import dataclass, field
from typing import Any

from kvmtune.audit.finding import Finding
from kvmtune.audit.rule import Rule, all_rules
from kvmtune.audit.thresholds import Thresholds
from kvmtune.audit.verifyplan import NoExperiment
from kvmtune.errors import UsageError
from kvmtune.host.root import HostReadError, HostRoot
from kvmtune.live.diagnose import Diagnoser, Diagnosis
from kvmtune.live.model import DiskCounters, GuestSample, NicCounters, Snapshot
from kvmtune.live.signals import rates
from kvmtune.live.sources import Sampler, parse_schedstat, vcpu_index
from kvmtune.live.symptoms import SIGNALS
from kvmtune.live.threads import Owner, Owners, ThreadStat, read_threads
from kvmtune.model.guest import Disk
from kvmtune.runner import Runner

TICK_S = 1.0
THROTTLE_NEAR = 0.8  # a disk at 80 % or more of an I/O limit is held by it
CPU_CAUSE_MIN = 0.05  # a neighbour that used a waited-on CPU for less than 5 % of the interval is not named
NO_RULE = "no rule covers this"

_VCPU_WARN = next(s.thresholds[""].warn for s in SIGNALS if s.name == "vcpu-delay")


@dataclass
class WhyLine:
    """One line of the breakdown."""

    area: str  # cpu | disk | net | memory
    share: float | None  # the fraction of the interval (or of the operations) it accounts for
    what: str  # the headline
    evidence: str
    cause: str
    rule: str | None
    fix: str
    verify: str
    no_rule: str = ""  # when ``rule`` is None: why no rule covers it

    def as_json(self) -> dict[str, Any]:
        return {"area": self.area, "share": self.share, "what": self.what, "evidence": self.evidence,
                "cause": self.cause, "rule": self.rule, "no_rule": self.no_rule or None, "fix": self.fix,
                "verify": self.verify}


@dataclass
class Target:
    name: str
    source: str
    key: str
    pid: int | None
    uuid: str | None
    libvirt: bool
    owner: str = ""  # a QEMU libvirt did not start: who runs it (user name, else "uid N")


@dataclass
class WhyReport:
    target: Target
    seconds: float
    accel: str | None  # kvm | tcg | None (not known)
    lines: list[WhyLine] = field(default_factory=list)
    vcpus: list[dict[str, Any]] = field(default_factory=list)
    disks: list[dict[str, Any]] = field(default_factory=list)
    nics: list[dict[str, Any]] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=dict)
    psi: dict[str, float] = field(default_factory=dict)  # the guest's cgroup: 'some' share of the interval
    notes: list[str] = field(default_factory=list)
    not_measured: dict[str, str] = field(default_factory=dict)  # a figure that could not be taken -> why
    # without named vCPU threads: the busiest threads' schedstat, whose largest wait bounds every vCPU's
    vcpu_wait_bound: dict[str, Any] | None = None

    @property
    def emulation(self) -> bool:
        return self.accel == "tcg"

    def as_json(self) -> dict[str, Any]:
        t = self.target
        return {"schema_version": 1, "kind": "kvmtune-why",
                "guest": {"name": t.name, "source": t.source, "key": t.key, "pid": t.pid, "uuid": t.uuid,
                          "owner": t.owner or None},
                "seconds": self.seconds, "accel": self.accel, "emulation": self.emulation,
                "explained": bool(self.lines), "lines": [line.as_json() for line in self.lines],
                "vcpus": self.vcpus, "disks": self.disks, "nics": self.nics, "memory": self.memory,
                "psi": self.psi, "not_measured": self.not_measured, "vcpu_wait_bound": self.vcpu_wait_bound,
                "notes": self.notes}


# --- finding the guest -------------------------------------------------------------------------------


def _libvirt_pid(host: HostRoot, name: str) -> int | None:
    text = host.read_optional(f"/run/libvirt/qemu/{name}.pid")
    return int(text.strip()) if text and text.strip().isdigit() else None


def find_target(host: HostRoot, snap: Snapshot, text: str) -> Target:
    """The one running guest ``text`` names (libvirt name or UUID, pid, QEMU ``-name``); UsageError otherwise."""
    matches: list[Target] = []
    for g in snap.guests.values():
        libvirt = g.pid is None
        pid = g.pid if g.pid is not None else (_libvirt_pid(host, g.name) if host.is_live else None)
        uuid = g.guest.uuid if g.guest is not None else None
        names = {g.name, *([uuid.lower()] if uuid else [])}
        if (text.isdigit() and pid == int(text)) or text in names or text.lower() in names:
            matches.append(Target(g.name, g.source, g.key, pid, uuid, libvirt, g.owner))
    if not matches:
        seen = ", ".join(sorted(g.name for g in snap.guests.values())) or "none"
        raise UsageError(f"{text}: no running guest has this name, UUID or pid (running: {seen})")
    if len(matches) > 1:
        shown = ", ".join(m.source + (f" ({m.owner})" if m.owner else "") for m in matches)
        raise UsageError(f"{text}: names {len(matches)} running guests ({shown}); "
                         "name it by pid or UUID")
    return matches[0]


# --- sampling ----------------------------------------------------------------------------------------


def _cpu_list(text: str | None) -> frozenset[int] | None:
    if not text:
        return None
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return None
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(cpus)


def _allowed(host: HostRoot, pid: int, tid: int) -> frozenset[int] | None:
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


def _keyed(text: str | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[key] = int(value)
    return out


def _psi_total(text: str | None) -> int | None:
    """'some … total=N' (µs) of a cgroup's ``*.pressure`` file."""
    for line in (text or "").splitlines():
        if line.startswith("some "):
            for part in line.split():
                if part.startswith("total=") and part[6:].isdigit():
                    return int(part[6:])
    return None


@dataclass
class _Vcpu:
    index: int
    tid: int
    allowed: frozenset[int] | None
    cpu_ns: int = 0
    delay_ns: int = 0
    waits: dict[int, int] = field(default_factory=dict)  # host CPU -> ns waited there


class _Tracker:
    """What the ticks add up: per host CPU, each owner's use; per vCPU, where it waited."""

    def __init__(self, host: HostRoot, target: Target, vcpus: dict[int, int]) -> None:
        self.host = host
        self.pid = target.pid or 0
        self.owners = Owners(host)
        self.me = os.getpid() if host.is_live else -1  # kvmtune's own sampling is not a neighbour
        self.clk = os.sysconf("SC_CLK_TCK")
        self.vcpus = {tid: _Vcpu(i, tid, _allowed(host, self.pid, tid)) for i, tid in vcpus.items()}
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
        out = {f"cpu.{k}": v for k, v in _keyed(self.host.read_optional(f"{self.cgroup}/cpu.stat")).items()}
        guest_dir = self.cgroup.rsplit("/", 1)[0] if self.cgroup.rsplit("/", 1)[-1].startswith("vcpu") else self.cgroup
        for resource in ("cpu", "io", "memory"):
            total = _psi_total(self.host.read_optional(f"{guest_dir}/{resource}.pressure"))
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


# --- rules -------------------------------------------------------------------------------------------


def _rule(rule_id: str) -> type[Rule] | None:
    return next((r for r in all_rules() if r.id == rule_id), None)


def _verify(rule_id: str | None, guest: str, again: str) -> str:
    rule = _rule(rule_id) if rule_id else None
    if rule is not None and rule.verify is not None and not isinstance(rule.verify, NoExperiment):
        return f"kvmtune verify --only {rule_id} (measures the fix), then `kvmtune why {guest}` again: {again}"
    return f"`kvmtune why {guest}` again after the change: {again}"


def _rule_fix(rule_id: str) -> str:
    rule = _rule(rule_id)
    return rule.fix_description if rule is not None else ""


# --- CPU ---------------------------------------------------------------------------------------------


def _thieves(tr: _Tracker, v: _Vcpu) -> list[tuple[Owner, float]]:
    """Owners that used the CPUs this vCPU waited on, weighted by where it waited, as a share of the interval."""
    total_wait = sum(v.waits.values()) or 1
    score: dict[Owner, float] = {}
    for cpu, waited in v.waits.items():
        for owner, used in tr.use.get(cpu, {}).items():
            if owner.kind == "guest-vcpu" and owner.pid == tr.pid and owner.detail == f"vCPU {v.index}":
                continue
            score[owner] = score.get(owner, 0.0) + waited / total_wait * used / tr.interval_ns
    return sorted(score.items(), key=lambda kv: -kv[1])


def _cpu_cause(tr: _Tracker, v: _Vcpu, owner: Owner, online: int | None, target: Target,
               pinned_in_definition: bool) -> tuple[str, str | None, str, str]:
    """(cause, rule, no-rule reason, fix) for the neighbour that ran most on this vCPU's CPUs."""
    mine_pinned = v.allowed is not None and online is not None and len(v.allowed) < online
    if owner.pid == tr.pid and owner.kind in ("qemu", "vhost"):
        return ("the guest's own QEMU threads (emulator, I/O, vhost) share its vCPUs' CPUs", "KVM-CPU-021", "",
                _rule_fix("KVM-CPU-021") or "pin the emulator threads (<emulatorpin>) away from the vCPUs")
    if owner.kind in ("guest-vcpu", "qemu", "vhost"):
        tid = tr.sample_tid.get(owner)
        theirs = _allowed(tr.host, owner.pid, tid) if tid else None
        their_pinned = theirs is not None and online is not None and len(theirs) < online
        if mine_pinned and their_pinned:
            cpus = ",".join(str(c) for c in sorted((v.allowed or frozenset()) & (theirs or frozenset())))
            cause = f"pinning overlap: both are confined to host CPU(s) {{{cpus}}}"
            if pinned_in_definition:
                return cause, "KVM-CPU-020", "", _rule_fix("KVM-CPU-020") or "give each guest its own host CPUs"
            return (cause, None, "no rule covers affinity set outside libvirt (taskset, a cgroup cpuset): the audit "
                    "cannot see it in a definition",
                    f"give {target.name} and {owner.name} host CPUs of their own (taskset -pc, cpuset), or fewer vCPUs")
        return ("overcommit: more runnable vCPUs than host CPUs", "KVM-HST-019", "",
                _rule_fix("KVM-HST-019") or "fewer vCPUs, or fewer guests on this host")
    what = f"host process {owner.name}" if owner.kind == "process" else f"kernel thread {owner.name}"
    if mine_pinned:
        return (f"{what} runs on the guest's pinned CPUs", "KVM-HST-046", "",
                f"move {owner.name} off CPU(s) {_cpus(v.allowed)} (taskset, systemd CPUAffinity=), "
                "or isolate the guests' CPUs (isolcpus / nohz_full)")
    return (f"{what} competes for the same CPUs", None, _NO_RULE_PROCESS,
            f"move {owner.name} off the guest's CPUs (taskset, systemd CPUAffinity=), or pin the guest away from it")


def _cpus(cpus: frozenset[int] | None) -> str:
    return ",".join(str(c) for c in sorted(cpus)) if cpus else "any"


def _cpu_lines(tr: _Tracker, report: WhyReport, online: int | None, pinned_in_definition: bool,
               signal_rules: tuple[list[str], str] = ([], ""), warn: float = _VCPU_WARN) -> None:
    """A line per vCPU that waited past the vcpu-delay signal's threshold. Where what kvmtune saw live names no
    rule, the rules top names for the same signal (``signal_rules``: Diagnoser.explain) stand instead."""
    interval = tr.interval_ns
    name = report.target.name
    for v in sorted(tr.vcpus.values(), key=lambda x: x.index):
        delay, busy = v.delay_ns / interval, v.cpu_ns / interval
        thieves = _thieves(tr, v)
        total_wait = sum(v.waits.values()) or 1
        report.vcpus.append({
            "vcpu": v.index, "tid": v.tid, "allowed_cpus": sorted(v.allowed) if v.allowed else None,
            "delay": delay, "busy": busy,
            "waits": {str(c): w / total_wait for c, w in sorted(v.waits.items()) if w > 0},
            "thieves": [{"who": o.label(), "kind": o.kind, "name": o.name, "pid": o.pid, "share": s}
                        for o, s in thieves[:5]],
        })
        if delay < warn:  # the vcpu-delay signal's warn level, as top judges it (the settings file's, if set)
            continue
        where, waited = max(v.waits.items(), key=lambda kv: kv[1])
        head = f"vCPU {v.index} waited {delay:.0%} of the interval for a host CPU (ran {busy:.0%})"
        if not thieves or thieves[0][1] < CPU_CAUSE_MIN:
            report.lines.append(WhyLine(
                "cpu", delay, head, f"{waited / total_wait:.0%} of the wait was on CPU {where}; no thread seen there "
                "used it for 5 % of the interval", "not seen: the wait has no neighbour kvmtune could see",
                None, "", _verify(None, name, "the wait should fall below 5 %"),
                no_rule="no rule covers a wait with no visible neighbour (short-lived processes, interrupts)"))
            continue
        owner = thieves[0][0]
        used_there = tr.use.get(where, {}).get(owner, 0) / interval
        evidence = (f"{waited / total_wait:.0%} of the wait was on CPU {where}, which {owner.label()} used for "
                    f"{used_there:.0%} of the interval")
        if len(thieves) > 1 and thieves[1][1] >= CPU_CAUSE_MIN:
            evidence += f"; also {thieves[1][0].label()} ({thieves[1][1]:.0%})"
        cause, rule, no_rule, fix = _cpu_cause(tr, v, owner, online, report.target, pinned_in_definition)
        rule, no_rule, cause = _signal_rule(rule, no_rule, cause, signal_rules)
        report.lines.append(WhyLine("cpu", delay, f"{head}: waits for {owner.name}", evidence, cause, rule, fix,
                                    _verify(rule, name, "the wait should fall below 5 %"), no_rule=no_rule))


_NO_RULE_PROCESS = "no rule covers a host process taking a guest's CPU time"


def _signal_rule(rule: str | None, no_rule: str, cause: str,
                 signal_rules: tuple[list[str], str]) -> tuple[str | None, str, str]:
    """The rule of a vCPU-wait line, judged as top judges the vcpu-delay signal: the rule the live cause names;
    else, for a host process competing (no cause of its own), the first rule top names (the others in the cause);
    a specific cause no rule covers (affinity set outside libvirt) keeps its reason and names top's rules."""
    rules, _ = signal_rules
    if rule is not None or not rules:
        return rule, no_rule, cause
    if no_rule == _NO_RULE_PROCESS:
        also = f"; the audit's findings for this signal: {', '.join(rules)}" if len(rules) > 1 else ""
        return rules[0], "", cause + also
    return None, f"{no_rule}; top names {', '.join(rules)} for this signal (the audit's findings in its topics)", cause


def _unnamed_cpu_line(tr: _Tracker, report: WhyReport, signal_rules: tuple[list[str], str],
                      warn: float = _VCPU_WARN) -> None:
    """No vCPU thread known: the vCPU wait is not measured. The process's busiest threads' schedstat stands in:
    the largest wait of any of its threads bounds every vCPU's wait from above (the vCPUs are among them)."""
    if tr.pid == 0 or tr.vcpus:
        return
    interval = tr.interval_ns
    figures = []
    for tid, last in tr.thread_last.items():
        first = tr.thread_first[tid]
        figures.append((tid, (last[0] - first[0]) / interval, (last[1] - first[1]) / interval))
    if not figures or tr.t1 <= tr.t0:
        report.not_measured["vcpu-delay"] = "its vCPU threads are unnamed and its threads' schedstat was not readable"
        return
    busiest = sorted(figures, key=lambda f: -f[1])[:4]
    bound = max(f[2] for f in figures)
    report.not_measured["vcpu-delay"] = (
        "its vCPU threads are unnamed (QEMU without debug-threads=on in its -name, and no QMP): the vCPU wait is not "
        f"measured; its threads' largest wait, {bound:.0%} of the interval, bounds it from above")
    report.vcpu_wait_bound = {"bound": bound, "busiest": [{"tid": tid, "busy": busy, "delay": delay}
                                                            for tid, busy, delay in busiest]}
    if bound < warn:
        return
    evidence = "; ".join(f"thread {t_} ran {b:.0%} and waited {d:.0%} of the interval" for t_, b, d in busiest[:3])
    rules, fix = signal_rules
    report.lines.append(WhyLine(
        "cpu", bound, f"vCPU wait not measured (unnamed threads); upper bound: a thread of its QEMU waited {bound:.0%} "
        "of the interval for a host CPU", f"the busiest threads' /proc schedstat: {evidence}",
        "an upper bound, not a vCPU's wait: name the threads (-name …,debug-threads=on) to measure each vCPU",
        rules[0] if rules else None, fix, _verify(rules[0] if rules else None, report.target.name,
                                                 "the wait should fall below 5 %"),
        no_rule="" if rules else "no finding of the audit is in the vcpu-delay signal's topics for this guest"))


def _quota_line(tr: _Tracker, report: WhyReport) -> None:
    a, b = tr.cg_start, tr.cg_end
    for resource in ("cpu", "io", "memory"):
        key = f"psi.{resource}"
        if key in a and key in b:
            report.psi[resource] = (b[key] - a[key]) * 1000 / tr.interval_ns
    throttled = (b.get("cpu.throttled_usec", 0) - a.get("cpu.throttled_usec", 0)) * 1000 / tr.interval_ns
    periods = b.get("cpu.nr_throttled", 0) - a.get("cpu.nr_throttled", 0)
    if periods > 0 and throttled >= _VCPU_WARN:
        report.lines.append(WhyLine(
            "cpu", throttled, f"its cgroup was throttled by a CPU quota for {throttled:.0%} of the interval",
            f"{tr.cgroup}/cpu.stat: nr_throttled +{periods}, throttled_usec +{throttled * tr.interval_ns / 1000:.0f}",
            "CPU quota throttling (cpu.max)", None,
            "raise or remove the quota (libvirt <cputune><quota>/<period>, virsh schedinfo; systemd CPUQuota=)",
            _verify(None, report.target.name, "nr_throttled should stop growing"),
            no_rule="no rule covers a CPU quota: it is set on purpose"))


# --- disks, network, memory ---------------------------------------------------------------------------


def _limits_qmp(sampler: Sampler, pid: int) -> dict[str, dict[str, int]]:
    qmp = sampler.procs.qmp(pid) if sampler.procs is not None else None
    if qmp is None:
        return {}
    try:
        blocks = qmp.execute("query-block")
    except Exception:  # a monitor that stops answering costs this one reading
        return {}
    out: dict[str, dict[str, int]] = {}
    for b in blocks if isinstance(blocks, list) else []:
        inserted = b.get("inserted") or {}
        name = str(b.get("device") or b.get("qdev") or "?").removeprefix("/machine/peripheral/")
        name = name.removesuffix("/virtio-backend")
        limits = {k: int(inserted.get(k) or 0) for k in ("iops", "iops_rd", "iops_wr", "bps", "bps_rd", "bps_wr")}
        out[name] = {k: v for k, v in limits.items() if v > 0}
    return out


def _limits_libvirt(sampler: Sampler, target: Target, disks: list[str]) -> dict[str, dict[str, int]]:
    keys = {"total_iops_sec": "iops", "read_iops_sec": "iops_rd", "write_iops_sec": "iops_wr",
            "total_bytes_sec": "bps", "read_bytes_sec": "bps_rd", "write_bytes_sec": "bps_wr"}
    out: dict[str, dict[str, int]] = {}
    for source in sampler.libvirt:
        if source.uri != target.source:
            continue
        try:
            dom = source.conn.lookupByName(target.name)
            for disk in disks:
                tune = dom.blockIoTune(disk, 0)
                out[disk] = {keys[k]: int(v) for k, v in tune.items() if k in keys and int(v) > 0}
        except Exception:  # libvirt's own error type; no limits read
            return out
    return out


def _held_by(limits: dict[str, int], rd: float, wr: float, rd_b: float, wr_b: float) -> str:
    seen = {"iops": rd + wr, "iops_rd": rd, "iops_wr": wr, "bps": rd_b + wr_b, "bps_rd": rd_b, "bps_wr": wr_b}
    for key, limit in limits.items():
        if seen[key] >= THROTTLE_NEAR * limit:
            unit = "ops/s" if key.startswith("iops") else "bytes/s"
            return f"{seen[key]:.0f} {unit} against its limit {key}={limit}"
    return ""


def _disk_lines(report: WhyReport, a: GuestSample, b: GuestSample, dt: float, limits: dict[str, dict[str, int]],
                diagnoses: list[Diagnosis], own_use: dict[str, int], interval_ns: int) -> None:
    main = sum(v for k, v in own_use.items() if k.startswith(("qemu-system", "qemu-kvm", "worker"))) / interval_ns
    iothreads = sum(v for k, v in own_use.items() if k.startswith("IO ")) / interval_ns
    for name, db in sorted(b.disks.items()):
        da = a.disks.get(name) or DiskCounters()
        rd, wr = (db.rd_ops - da.rd_ops) / dt, (db.wr_ops - da.wr_ops) / dt
        rd_b, wr_b = (db.rd_bytes - da.rd_bytes) / dt, (db.wr_bytes - da.wr_bytes) / dt
        ops = (db.rd_ops - da.rd_ops) + (db.wr_ops - da.wr_ops)
        busy_ns = (db.rd_ns - da.rd_ns) + (db.wr_ns - da.wr_ns) + (db.fl_ns - da.fl_ns)
        latency = busy_ns / ops / 1e6 if ops else None
        depth = busy_ns / (dt * 1e9)
        held = _held_by(limits.get(name, {}), rd, wr, rd_b, wr_b)
        report.disks.append({"disk": name, "read_iops": rd, "write_iops": wr, "read_bytes_s": rd_b, "write_bytes_s": wr_b,
                             "latency_ms": latency, "queue_depth": depth, "limits": limits.get(name, {}),
                             "throttled": bool(held), "main_loop_cpu": main, "iothreads_cpu": iothreads})
        where = f"I/O done by {'IOThreads' if iothreads > main else 'the main loop'} (main loop {main:.0%}, " \
                f"IOThreads {iothreads:.0%} of a CPU)"
        lat = "–" if latency is None else f"{latency:.1f} ms/op"
        if held:
            report.lines.append(WhyLine(
                "disk", min(1.0, depth) or None, f"disk {name} is throttled: {held}",
                f"{rd + wr:.0f} ops/s, {lat}, queue depth {depth:.1f}; {where}",
                "throttled: an I/O limit (<iotune>, QMP block_set_io_throttle) holds it", None,
                "raise or remove the limit (virsh blkdeviotune DOMAIN DISK …, QMP block_set_io_throttle)",
                _verify(None, report.target.name, "the disk should run below its limit"),
                no_rule="no rule covers an I/O limit: it is set on purpose"))
            continue
        for d in diagnoses:
            if d.signal == f"disk-latency {name}":
                rule = d.rules[0] if d.rules else None
                report.lines.append(WhyLine(
                    "disk", min(1.0, depth), f"disk {name}: {d.value} ({d.level}, threshold {d.threshold})",
                    f"{rd + wr:.0f} ops/s, queue depth {depth:.1f}; {where}; rules of its configuration: "
                    f"{d.explanation}", "the disk's configuration", rule, d.fix or (_rule_fix(rule) if rule else ""),
                    _verify(rule, report.target.name, "the latency should fall below the threshold"),
                    no_rule="" if rule else "no rule covers this disk's latency: no finding of its configuration "
                    "explains it"))


HOST_BUSY = 0.8  # a backing device busy 80 % of the interval or more is saturated
KSM_SHARE = 0.10  # KSM merging a tenth of the guest's memory or more is worth a line


def backing_device(host: HostRoot, source: str | None) -> str | None:
    """The host block device behind a disk's source: the device itself, or the one holding the file (through
    ``/sys/dev/block/MAJ:MIN``); None for a network disk or a file on a file system without one (tmpfs, NFS)."""
    if not source or not source.startswith("/"):
        return None
    try:
        st = os.stat(host.beneath(source))
    except (OSError, HostReadError):
        return None
    dev = st.st_rdev if stat.S_ISBLK(st.st_mode) else st.st_dev
    link = host.readlink(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    return link.rsplit("/", 1)[-1] if link else None


def parse_diskstats(text: str) -> dict[str, tuple[int, int, int]]:
    """``/proc/diskstats``: device -> (reads + writes completed, ms spent on them, ms the device was busy)."""
    out: dict[str, tuple[int, int, int]] = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 13 and all(x.isdigit() for x in f[3:13]):
            out[f[2]] = (int(f[3]) + int(f[7]), int(f[6]) + int(f[10]), int(f[12]))
    return out


@dataclass
class DiskEdges:
    """``/proc/diskstats`` at the start and the end of the sampling."""

    t0: float = 0.0
    t1: float = 0.0
    start: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    end: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    def read(self, host: HostRoot, first: bool) -> None:
        stats = parse_diskstats(host.read_optional("/proc/diskstats") or "")
        if first:
            self.t0, self.start = time.monotonic(), stats
        else:
            self.t1, self.end = time.monotonic(), stats

    def of(self, dev: str) -> dict[str, Any] | None:
        if dev not in self.start or dev not in self.end:
            return None
        a, b = self.start[dev], self.end[dev]
        ios, ms, busy = b[0] - a[0], b[1] - a[1], b[2] - a[2]
        return {"device": dev, "await_ms": ms / ios if ios > 0 else None,
                "util": min(1.0, busy / max(1e-3, (self.t1 - self.t0) * 1000)), "ios": ios}


def _model_disk(g: GuestSample, name: str) -> Disk | None:
    return next((d for d in (g.guest.disks if g.guest else []) if d.target == name or name.endswith(d.target)), None)


def _queue_rule(findings: list[Finding], disk: Disk) -> tuple[str, Finding] | None:
    """The rule of the KVM-STO-011 family that judged this disk's queue count, with its finding."""
    for f in findings:
        if f.rule == "KVM-STO-022" and f.target.device == disk.label and "queues=" in f.actual:
            return f.rule, f
        if f.rule == "KVM-STO-011" and disk.target in f.actual.replace(",", " ").split():
            return f.rule, f
    return None


def _disk_extras(report: WhyReport, host: HostRoot, g: GuestSample, edges: DiskEdges, findings: list[Finding]) -> None:
    """The backing device's host diskstats, and the queue count against the vCPUs, for each disk sampled."""
    vcpus = len(g.vcpus) or (g.guest.vcpus if g.guest is not None and g.guest.vcpus else 1)
    for entry in report.disks:
        name = entry["disk"]
        model = _model_disk(g, name)
        dev = backing_device(host, model.source if model else None)
        host_io = edges.of(dev) if dev else None
        entry["host_device"] = host_io
        ops = entry["read_iops"] + entry["write_iops"]
        if host_io is not None:
            aw = "–" if host_io["await_ms"] is None else f"{host_io['await_ms']:.1f} ms"
            for line in report.lines:
                if line.area == "disk" and line.what.startswith(f"disk {name}"):
                    line.evidence += f"; host device {dev}: await {aw}, {host_io['util']:.0%} busy"
            if host_io["util"] >= HOST_BUSY and ops >= 1:
                report.lines.append(WhyLine(
                    "disk", host_io["util"], f"disk {name}: its backing device {dev} was {host_io['util']:.0%} busy "
                    f"on the host (await {aw})",
                    f"/proc/diskstats {dev}: {host_io['ios']} I/Os, await {aw}, busy {host_io['util']:.0%} of the "
                    f"interval; the guest did {ops:.0f} ops/s", "the host device behind it is saturated", None,
                    f"move the image to a less busy device, or find who else uses {dev} (iotop, /proc/diskstats)",
                    _verify(None, report.target.name, f"{dev} should be less than {HOST_BUSY:.0%} busy"),
                    no_rule="no rule covers a saturated host device: it is shared with whatever else uses it"))
        judged = _queue_rule(findings, model) if model is not None else None
        entry["queues"] = model.queues if model is not None and model.queues else (1 if judged else None)
        if judged is not None and ops >= 1:
            rule, finding = judged
            report.lines.append(WhyLine(
                "disk", None, f"disk {name}: fewer queues than its {vcpus} vCPUs ({finding.actual})",
                f"{ops:.0f} ops/s, queue depth {entry['queue_depth']:.1f}; {finding.evidence}",
                "queue count against vCPUs: the vCPUs' submissions share one queue's lock", rule,
                finding.fix.description or _rule_fix(rule),
                _verify(rule, report.target.name, "the latency at the same load should fall")))


OVS_DB = "/run/openvswitch/db.sock"
_IFNAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,14}")  # a Linux interface name that cannot start an option
OVS_TIMEOUT_S = 2.0
VHOST_BUSY = 0.5  # a single-queue NIC whose vhost worker is busy half a CPU or more is held by its one queue


@dataclass
class Link:
    """What the host's side of one guest NIC shows: its switch, queues and the switch's drop counters."""

    master: str | None = None  # the Linux bridge, or the OVS bridge
    ovs: bool = False
    queues: int | None = None  # the tap's queues (/sys/class/net/TAP/queues/tx-*)
    counters: dict[str, int] = field(default_factory=dict)  # "bridge br0 rx_dropped" -> count


def _ovs_numbers(text: str) -> dict[str, int]:
    """``ovs-vsctl get Interface X statistics``: '{collisions=0, rx_dropped=3, …}'."""
    out: dict[str, int] = {}
    for part in text.strip().strip("{}").split(","):
        key, _, value = part.strip().partition("=")
        if value.strip().isdigit():
            out[key] = int(value)
    return out


def _ovs_lost(text: str) -> int | None:
    """``ovs-appctl dpctl/show``: 'lookups: hit:N missed:N lost:N' per datapath, summed."""
    total = None
    for line in text.splitlines():
        for part in line.split():
            if part.startswith("lost:") and part[5:].isdigit():
                total = (total or 0) + int(part[5:])
    return total


def read_link(host: HostRoot, runner: Runner | None, tap: str) -> Link:
    """One tap's switch side: a Linux bridge through sysfs; an OVS port through ovs-vsctl/ovs-appctl, asked only
    when OVS runs (its database socket exists) and a runner is given."""
    link = Link()
    if not _IFNAME.fullmatch(tap) or tap in (".", ".."):  # never an option to ovs-vsctl, never a path
        return link
    queues = [q for q in host.listdir(f"/sys/class/net/{tap}/queues") if q.startswith("tx-")]
    link.queues = len(queues) or None
    master = (host.readlink(f"/sys/class/net/{tap}/master") or "").rsplit("/", 1)[-1] or None
    if master == "ovs-system":
        link.ovs = True
        if runner is None or not host.exists(OVS_DB):
            return link
        br = runner.run(["ovs-vsctl", f"--timeout={OVS_TIMEOUT_S:.0f}", "port-to-br", tap], timeout=OVS_TIMEOUT_S + 1)
        link.master = br.stdout.strip() or None if br.ok else None
        st = runner.run(["ovs-vsctl", f"--timeout={OVS_TIMEOUT_S:.0f}", "get", "Interface", tap, "statistics"],
                        timeout=OVS_TIMEOUT_S + 1)
        numbers = _ovs_numbers(st.stdout) if st.ok else {}
        for key in ("rx_dropped", "tx_dropped"):
            if key in numbers:
                link.counters[f"OVS port {tap} {key}"] = numbers[key]
        dp = runner.run(["ovs-appctl", f"--timeout={OVS_TIMEOUT_S:.0f}", "dpctl/show"], timeout=OVS_TIMEOUT_S + 1)
        lost = _ovs_lost(dp.stdout) if dp.ok else None
        if lost is not None:
            link.counters["OVS datapath lost (all ports)"] = lost
        return link
    link.master = master
    if master:
        for key in ("rx_dropped", "tx_dropped"):
            value = host.read_optional(f"/sys/class/net/{master}/statistics/{key}")
            if value and value.strip().isdigit():
                link.counters[f"bridge {master} {key}"] = int(value)
    return link


def _vhost_delay(tr: _Tracker) -> tuple[float, int | None]:
    """The vhost workers' run delay as a share of the interval, and the CPU the most delayed one last ran on."""
    delays = {tid: tr.vhost_last[tid][1] - first[1] for tid, first in tr.vhost_first.items() if tid in tr.vhost_last}
    if not delays:
        return 0.0, None
    worst = max(delays, key=lambda tid: delays[tid])
    return sum(delays.values()) / tr.interval_ns, tr.vhost_cpu.get(worst)


def _vhost_line(report: WhyReport, tr: _Tracker, delay: float, cpu: int | None) -> None:
    users = {o: used for o, used in tr.use.get(cpu if cpu is not None else -1, {}).items()
             if not (o.kind == "vhost" and o.pid == tr.pid)}
    own = tr.own_vcpu_use.get(cpu if cpu is not None else -1, 0)
    if own:
        users[Owner("guest-vcpu", report.target.name, tr.pid, "its own vCPUs")] = own
    head = f"the vhost worker waited {delay:.0%} of the interval for a host CPU"
    if not users:
        evidence, who = f"it last ran on CPU {cpu}; no thread seen there", None
    else:
        who, used = max(users.items(), key=lambda kv: kv[1])
        evidence = f"it last ran on CPU {cpu}, which {who.label()} used for {used / tr.interval_ns:.0%} of the interval"
    if who is not None and who.pid == tr.pid:
        report.lines.append(WhyLine(
            "net", delay, f"{head}: waits for {report.target.name}'s own threads", evidence,
            "the guest's vhost worker shares host CPUs with its own vCPUs (libvirt puts vhost workers with the "
            "emulator threads)", "KVM-CPU-021", _rule_fix("KVM-CPU-021") or "pin the emulator threads away",
            _verify("KVM-CPU-021", report.target.name, "the vhost worker's wait should fall below 5 %")))
        return
    report.lines.append(WhyLine(
        "net", delay, head + (f": waits for {who.name}" if who else ""), evidence,
        "other threads take the vhost worker's CPU", None,
        "give the guest's emulator threads (which carry its vhost workers) CPUs of their own (<emulatorpin>)",
        _verify(None, report.target.name, "the vhost worker's wait should fall below 5 %"),
        no_rule="no rule covers a vhost worker crowded by other threads: the audit cannot see who runs beside it"))


def _drop_line(report: WhyReport, name: str, drops: dict[str, int], nic: dict[str, Any],
               diagnosis: Diagnosis | None, mismatch: bool) -> None:
    tap = drops.get("tap to guest", 0) + drops.get("tap from guest", 0)
    where = "; ".join(f"{k} +{v}" for k, v in drops.items() if v > 0)
    evidence = (f"{where}; txqueuelen {nic['txqueuelen']}; {nic['queues'] or '?'} queue(s) on {nic['vcpus']} vCPU(s); "
                f"vhost worker {nic['vhost_cpu']:.0%} of a CPU, waited {nic['vhost_delay']:.0%}")
    rule = diagnosis.rules[0] if diagnosis is not None and diagnosis.rules else None
    if rule is None and tap and mismatch:
        rule = "KVM-NET-008"
    if tap:
        cause, no_rule = "drops on the tap", "no rule covers these drops: no finding of its configuration explains them"
        fix = (diagnosis.fix if diagnosis is not None and diagnosis.fix else _rule_fix(rule) if rule else
               f"raise the tap's queue (ip link set {name} txqueuelen 10000), give the NIC queues = vCPUs")
    else:
        cause = "drops in the switch (the bridge or OVS), not on the tap"
        no_rule = "no rule covers drops in a bridge or OVS: the audit judges guest definitions, not the switch's state"
        fix = "look at the switch: its other ports, its flows (ovs-appctl dpctl/show), its MTU"
        rule = None
    report.lines.append(WhyLine(
        "net", None, f"NIC {name}: {sum(drops.values())} packets dropped", evidence, cause, rule, fix,
        _verify(rule, report.target.name, "no more drops"), no_rule="" if rule else no_rule))


def _net_lines(report: WhyReport, diagnoses: list[Diagnosis], tr: _Tracker, a: GuestSample, b: GuestSample,
               links0: dict[str, Link], links1: dict[str, Link]) -> None:
    """Per NIC: drops on the tap and its bridge or OVS port, its queues against the vCPUs; the vhost worker's CPU and
    run delay."""
    vhost = sum(used for per_cpu in tr.use.values() for o, used in per_cpu.items()
                if o.kind == "vhost" and o.pid == tr.pid) / tr.interval_ns
    delay, delay_cpu = _vhost_delay(tr)
    vcpus = len(b.vcpus) or (b.guest.vcpus if b.guest is not None and b.guest.vcpus else 1)
    for name in sorted(b.nics):
        na, nb = a.nics.get(name) or NicCounters(), b.nics[name]
        la, lb = links0.get(name) or Link(), links1.get(name) or Link()
        drops = {"tap to guest": nb.rx_drop - na.rx_drop, "tap from guest": nb.tx_drop - na.tx_drop}
        drops.update({k: v - la.counters[k] for k, v in lb.counters.items() if k in la.counters})
        qlen = tr.host.read_optional(f"/sys/class/net/{name}/tx_queue_len")
        drops = {k: max(0, v) for k, v in drops.items()}
        nic: dict[str, Any] = {"nic": name, "txqueuelen": int(qlen) if qlen and qlen.strip().isdigit() else None,
               "vhost_cpu": vhost, "vhost_delay": delay, "vcpus": vcpus, "queues": lb.queues,
               "switch": "ovs" if lb.ovs else "bridge" if lb.master else None, "bridge": lb.master,
               "drops": drops}
        report.nics.append(nic)
        queues = lb.queues
        mismatch = queues is not None and ((vcpus >= 2 and queues == 1) or queues > vcpus)
        if sum(drops.values()) > 0:
            diagnosis = next((d for d in diagnoses if d.signal == f"net-drops {name}"), None)
            _drop_line(report, name, drops, nic, diagnosis, mismatch)
        elif mismatch and vhost >= VHOST_BUSY:
            report.lines.append(WhyLine(
                "net", None, f"NIC {name}: {queues} queue(s) on {vcpus} vCPU(s) while its vhost worker was busy "
                f"{vhost:.0%} of a CPU", f"/sys/class/net/{name}/queues: {queues} tx queue(s)",
                "queue count against vCPUs: one vhost worker and one vCPU carry the NIC", "KVM-NET-008",
                _rule_fix("KVM-NET-008"), _verify("KVM-NET-008", report.target.name, "the vhost load spreads")))
    if delay >= _VCPU_WARN:
        _vhost_line(report, tr, delay, delay_cpu)
    for n in b.guest.nics if b.guest is not None else []:
        if n.type == "user":
            report.notes.append(f"net: NIC {n.index} is QEMU's user-mode network (slirp; KVM-NET-003): no tap, bridge "
                                "or vhost worker to read, its packets are the work of QEMU's main loop")


def _kib(text: str, key: str) -> int | None:
    for line in text.splitlines():
        if line.startswith(key + ":"):
            value = line.split(":", 1)[1].split()
            return int(value[0]) if value and value[0].isdigit() else None
    return None


def _ksm_pages(host: HostRoot, pid: int) -> int | None:
    """The process's pages KSM merged: ``/proc/PID/ksm_merging_pages`` (Linux 6.1+), or ``ksm_stat``'s line."""
    text = host.read_optional(f"/proc/{pid}/ksm_merging_pages")
    if text and text.strip().isdigit():
        return int(text)
    for line in (host.read_optional(f"/proc/{pid}/ksm_stat") or "").splitlines():
        key, _, value = line.partition(" ")
        if key == "ksm_merging_pages" and value.strip().isdigit():
            return int(value)
    return None


def _ksm_line(report: WhyReport, tr: _Tracker | None, pid: int, share: float, findings: list[Finding]) -> None:
    ksmd = sum(used for per_cpu in (tr.use.values() if tr else ()) for o, used in per_cpu.items()
               if o.kind == "kernel" and o.name == "ksmd") / (tr.interval_ns if tr else 1)
    pinned = next((f for f in findings if f.rule == "KVM-MEM-001"), None)
    rule = pinned.rule if pinned else None
    report.lines.append(WhyLine(
        "memory", share, f"KSM merges {share:.0%} of the guest's memory",
        f"/proc/{pid}/ksm_merging_pages: {report.memory['ksm_kib'] // 1024} MiB; ksmd used {ksmd:.0%} of a CPU",
        "KSM: every write to a merged page is a copy-on-write fault" +
        ("; a pinned guest's pages merged across NUMA nodes" if pinned else ""), rule,
        _rule_fix(rule) if rule else "<memoryBacking><nosharepages/> for this guest, or stop KSM where memory fits",
        _verify(rule, report.target.name, "ksm_merging_pages should fall"),
        no_rule="" if rule else "no rule covers KSM sharing on an unpinned guest: it is a memory trade, "
        "judged host-wide (KVM-HST-005/006)"))


def _hugepage_lines(report: WhyReport, findings: list[Finding]) -> None:
    mem = report.memory
    large = next((f for f in findings if f.rule == "KVM-MEM-004"), None)
    if large is not None and not mem.get("hugetlb_kib") and (mem.get("thp_share") or 0.0) < 0.5:
        report.lines.append(WhyLine(
            "memory", None, "a large guest backed by small pages: no hugetlb pages, "
            f"{mem.get('thp_share') or 0.0:.0%} transparent huge pages",
            f"{large.actual}; HugetlbPages 0 kB", "TLB misses on 4 KiB pages", "KVM-MEM-004", large.fix.description,
            _verify("KVM-MEM-004", report.target.name, "HugetlbPages should equal the guest's memory")))


def _memory_lines(report: WhyReport, host: HostRoot, diagnoses: list[Diagnosis], tr: _Tracker | None = None,
                  findings: list[Finding] | None = None) -> None:
    pid = report.target.pid
    findings = findings or []
    if pid is not None:
        status = host.read_optional(f"/proc/{pid}/status") or ""
        rollup = host.read_optional(f"/proc/{pid}/smaps_rollup") or ""
        swap, anon, thp = _kib(status, "VmSwap"), _kib(rollup, "Anonymous"), _kib(rollup, "AnonHugePages")
        hugetlb, ksm = _kib(status, "HugetlbPages"), _ksm_pages(host, pid)
        backed = (anon or 0) + (hugetlb or 0)
        ksm_kib = ksm * os.sysconf("SC_PAGE_SIZE") // 1024 if ksm is not None else None
        report.memory.update({"swap_kib": swap, "anon_kib": anon, "thp_kib": thp,
                              "thp_share": thp / anon if thp is not None and anon else None,
                              "hugetlb_kib": hugetlb, "hugetlb_share": hugetlb / backed if hugetlb is not None and backed
                              else None, "ksm_kib": ksm_kib,
                              "ksm_share": ksm_kib / backed if ksm_kib is not None and backed else None})
        if ksm is None and (host.read_optional("/sys/kernel/mm/ksm/run") or "").strip() == "1":
            report.notes.append(f"KSM: runs, but /proc/{pid}/ksm_merging_pages is not readable (Linux before 6.1): "
                                "the guest's share is not known")
        if swap:
            report.lines.append(WhyLine(
                "memory", None, f"{swap / 1024:.0f} MiB of QEMU's memory is swapped out", f"/proc/{pid}/status VmSwap",
                "swap", "KVM-HST-009", _rule_fix("KVM-HST-009"),
                _verify("KVM-HST-009", report.target.name, "VmSwap should stay at 0")))
        if (report.memory["ksm_share"] or 0.0) >= KSM_SHARE:
            _ksm_line(report, tr, pid, report.memory["ksm_share"], findings)
        _hugepage_lines(report, findings)
    for d in diagnoses:
        if d.signal in ("balloon", "psi-memory"):
            rule = d.rules[0] if d.rules else None
            report.lines.append(WhyLine(
                "memory", None, f"{d.signal}: {d.value} ({d.level}, threshold {d.threshold})", d.explanation, d.signal,
                rule, d.fix, _verify(rule, report.target.name, "below the threshold"),
                no_rule="" if rule else "no rule covers it: no finding explains it"))


# --- the whole ---------------------------------------------------------------------------------------


def _accel(tr: _Tracker, sampler: Sampler, target: Target, g: GuestSample) -> str | None:
    for tid in tr.vcpus:
        comm = (tr.host.read_optional(f"/proc/{tr.pid}/task/{tid}/comm") or "").strip()
        if comm.endswith("/TCG"):
            return "tcg"
        if comm.endswith("/KVM"):
            return "kvm"
    qmp = sampler.procs.qmp(target.pid) if sampler.procs is not None and target.pid else None
    if qmp is not None:
        try:
            kvm = qmp.execute("query-kvm")
            return "kvm" if isinstance(kvm, dict) and kvm.get("enabled") else "tcg"
        except Exception:  # no answer: not known
            pass
    if g.guest is not None and g.guest.virt_type:
        return "kvm" if g.guest.virt_type == "kvm" else "tcg"
    return None


def _thread_notes(host: HostRoot, target: Target, vcpus: dict[int, int], report: WhyReport) -> None:
    named = any(vcpu_index(host.read_optional(f"/proc/{target.pid}/task/{tid}/comm") or "") is not None
                for tid in host.listdir(f"/proc/{target.pid}/task")) if target.pid else False
    if target.pid is None:
        report.notes.append("threads: the guest's QEMU process is not on this host (a remote libvirt): "
                            "no per-thread breakdown")
    elif not named and vcpus:
        report.notes.append("threads: QEMU runs without -name …,debug-threads=on, so its threads are unnamed: vCPUs "
                            "were found through QMP, its I/O threads and main loop cannot be told apart")
    elif not named:
        report.notes.append("threads: QEMU runs without -name …,debug-threads=on and without QMP, so its vCPU "
                            "threads cannot be found: no CPU breakdown")


def why(host: HostRoot, sampler: Sampler, guest: str, seconds: float, thresholds: Thresholds | None = None) -> WhyReport:
    """Sample ``guest`` for ``seconds``; ``thresholds``: the settings file's, which top and sample judge with too."""
    first = sampler.snapshot()
    target = find_target(host, first, guest)
    vcpus: dict[int, int] = {}
    if target.pid is not None:
        if sampler.procs is not None and not target.libvirt:
            vcpus = {i: int(t) for i, t in sampler.procs.vcpu_threads(target.pid).items()}
        else:
            vcpus = {i: int(tid) for tid in host.listdir(f"/proc/{target.pid}/task")
                     if (i := vcpu_index(host.read_optional(f"/proc/{target.pid}/task/{tid}/comm") or "")) is not None}
    tr = _Tracker(host, target, vcpus)
    g0 = first.guests[target.key]
    report = WhyReport(target, seconds, None)
    _thread_notes(host, target, vcpus, report)
    if target.pid is not None and tr.cgroup is None:
        report.notes.append("cgroup: the guest has no cgroup v2 of its own (cgroup v1, or the root cgroup): "
                            "no per-guest PSI or CPU quota")
    report.accel = _accel(tr, sampler, target, g0)
    runner = Runner() if host.is_live else None  # OVS is asked only about the host kvmtune runs on
    taps = list(g0.nics)
    links0 = {tap: read_link(host, runner, tap) for tap in taps}
    edges = DiskEdges()
    edges.read(host, first=True)
    if target.pid is not None:
        tr.tick()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(min(TICK_S, max(0.0, deadline - time.monotonic())))
        if target.pid is not None:
            tr.tick()
    edges.read(host, first=False)
    links1 = {tap: read_link(host, runner, tap) for tap in taps}
    last = sampler.snapshot()
    g1 = last.guests.get(target.key)
    if g1 is None:
        raise UsageError(f"{guest}: the guest stopped while it was sampled")
    report.seconds = max(last.t - first.t, 1e-6)
    report.notes.extend(last.notes + g1.notes)
    diagnoser = Diagnoser(host, thresholds)
    warn = next(s.thresholds[""].warn for s in diagnoser.signals if s.name == "vcpu-delay")
    diagnoses = [d for d in diagnoser.diagnose(rates(first, last), last) if d.guest in (target.key, "")]
    findings = diagnoser.findings_for(g1)
    online = last.host.online_cpus
    pinned = bool(g1.guest is not None and g1.guest.vcpu_pinned)
    signal_rules = diagnoser.explain("vcpu-delay", g1)
    _cpu_lines(tr, report, online, pinned, signal_rules, warn)
    _unnamed_cpu_line(tr, report, signal_rules, warn)
    if target.pid is None and not g1.vcpus:
        report.not_measured["vcpu-delay"] = "the guest's QEMU process is not on this host and libvirt gave no vCPU delay"
    _quota_line(tr, report)
    limits = (_limits_libvirt(sampler, target, list(g1.disks)) if target.libvirt
              else _limits_qmp(sampler, target.pid) if target.pid else {})
    _disk_lines(report, g0, g1, report.seconds, limits, diagnoses, tr.own_use, tr.interval_ns)
    _disk_extras(report, host, g1, edges, findings)
    _net_lines(report, diagnoses, tr, g0, g1, links0, links1)
    _memory_lines(report, host, diagnoses, tr, findings)
    report.lines.sort(key=lambda line: -(line.share or 0.0))
    return report
