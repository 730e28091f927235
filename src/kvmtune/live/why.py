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
import time
from dataclasses import dataclass, field
from typing import Any

from kvmtune.audit.rule import Rule, all_rules
from kvmtune.audit.verifyplan import NoExperiment
from kvmtune.errors import UsageError
from kvmtune.host.root import HostRoot
from kvmtune.live.diagnose import Diagnoser, Diagnosis
from kvmtune.live.model import DiskCounters, GuestSample, Snapshot
from kvmtune.live.signals import rates
from kvmtune.live.sources import Sampler, parse_schedstat, vcpu_index
from kvmtune.live.symptoms import SIGNALS
from kvmtune.live.threads import Owner, Owners, ThreadStat, read_threads

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

    @property
    def emulation(self) -> bool:
        return self.accel == "tcg"

    def as_json(self) -> dict[str, Any]:
        t = self.target
        return {"schema_version": 1, "kind": "kvmtune-why",
                "guest": {"name": t.name, "source": t.source, "key": t.key, "pid": t.pid, "uuid": t.uuid},
                "seconds": self.seconds, "accel": self.accel, "emulation": self.emulation,
                "explained": bool(self.lines), "lines": [line.as_json() for line in self.lines],
                "vcpus": self.vcpus, "disks": self.disks, "nics": self.nics, "memory": self.memory,
                "psi": self.psi, "notes": self.notes}


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
            matches.append(Target(g.name, g.source, g.key, pid, uuid, libvirt))
    if not matches:
        seen = ", ".join(sorted(g.name for g in snap.guests.values())) or "none"
        raise UsageError(f"{text}: no running guest has this name, UUID or pid (running: {seen})")
    if len(matches) > 1:
        raise UsageError(f"{text}: names {len(matches)} running guests ({', '.join(m.source for m in matches)}); "
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
        self.prev: dict[int, ThreadStat] = {}
        self.prev_sched: dict[int, tuple[int, int]] = {}
        self.cgroup = _cgroup_dir(host, self.pid, next(iter(vcpus.values()), self.pid)) if self.pid else None
        self.cg_start: dict[str, int] = {}
        self.cg_end: dict[str, int] = {}
        self.t0 = self.t1 = time.monotonic()

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
            if before is None or (tid in self.vcpus and t.pid == self.pid) or t.pid == self.me:
                continue
            used = (t.ticks - before.ticks) * 1_000_000_000 // self.clk
            if used <= 0:
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
    return (f"{what} competes for the same CPUs", None,
            "no rule covers a host process taking a guest's CPU time",
            f"move {owner.name} off the guest's CPUs (taskset, systemd CPUAffinity=), or pin the guest away from it")


def _cpus(cpus: frozenset[int] | None) -> str:
    return ",".join(str(c) for c in sorted(cpus)) if cpus else "any"


def _cpu_lines(tr: _Tracker, report: WhyReport, online: int | None, pinned_in_definition: bool) -> None:
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
        if delay < _VCPU_WARN:
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
        report.lines.append(WhyLine("cpu", delay, f"{head}: waits for {owner.name}", evidence, cause, rule, fix,
                                    _verify(rule, name, "the wait should fall below 5 %"), no_rule=no_rule))


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


def _net_lines(report: WhyReport, diagnoses: list[Diagnosis], tr: _Tracker, g: GuestSample) -> None:
    vhost = sum(used for per_cpu in tr.use.values() for o, used in per_cpu.items()
                if o.kind == "vhost" and o.pid == tr.pid) / tr.interval_ns
    for name in g.nics:
        qlen = tr.host.read_optional(f"/sys/class/net/{name}/tx_queue_len")
        report.nics.append({"nic": name, "txqueuelen": int(qlen) if qlen and qlen.strip().isdigit() else None,
                            "vhost_cpu": vhost, "vcpus": len(g.vcpus)})
    for d in diagnoses:
        if d.signal.startswith("net-drops"):
            rule = d.rules[0] if d.rules else None
            report.lines.append(WhyLine(
                "net", None, f"{d.signal}: {d.value} ({d.level})",
                f"vhost worker {vhost:.0%} of a CPU; rules of its configuration: {d.explanation}", "drops on the tap",
                rule, d.fix, _verify(rule, report.target.name, "no more drops"),
                no_rule="" if rule else "no rule covers these drops: no finding of its configuration explains them"))


def _kib(text: str, key: str) -> int | None:
    for line in text.splitlines():
        if line.startswith(key + ":"):
            value = line.split(":", 1)[1].split()
            return int(value[0]) if value and value[0].isdigit() else None
    return None


def _memory_lines(report: WhyReport, host: HostRoot, diagnoses: list[Diagnosis]) -> None:
    pid = report.target.pid
    if pid is not None:
        status = host.read_optional(f"/proc/{pid}/status") or ""
        rollup = host.read_optional(f"/proc/{pid}/smaps_rollup") or ""
        swap, anon, thp = _kib(status, "VmSwap"), _kib(rollup, "Anonymous"), _kib(rollup, "AnonHugePages")
        report.memory.update({"swap_kib": swap, "anon_kib": anon, "thp_kib": thp,
                              "thp_share": thp / anon if thp is not None and anon else None})
        if swap:
            report.lines.append(WhyLine(
                "memory", None, f"{swap / 1024:.0f} MiB of QEMU's memory is swapped out", f"/proc/{pid}/status VmSwap",
                "swap", "KVM-HST-009", _rule_fix("KVM-HST-009"),
                _verify("KVM-HST-009", report.target.name, "VmSwap should stay at 0")))
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


def why(host: HostRoot, sampler: Sampler, guest: str, seconds: float) -> WhyReport:
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
    if target.pid is not None:
        tr.tick()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(min(TICK_S, max(0.0, deadline - time.monotonic())))
        if target.pid is not None:
            tr.tick()
    last = sampler.snapshot()
    g1 = last.guests.get(target.key)
    if g1 is None:
        raise UsageError(f"{guest}: the guest stopped while it was sampled")
    report.seconds = max(last.t - first.t, 1e-6)
    report.notes.extend(last.notes + g1.notes)
    diagnoses = [d for d in Diagnoser(host).diagnose(rates(first, last), last) if d.guest in (target.key, "")]
    online = last.host.online_cpus
    pinned = bool(g1.guest is not None and g1.guest.vcpu_pinned)
    _cpu_lines(tr, report, online, pinned)
    _quota_line(tr, report)
    limits = (_limits_libvirt(sampler, target, list(g1.disks)) if target.libvirt
              else _limits_qmp(sampler, target.pid) if target.pid else {})
    _disk_lines(report, g0, g1, report.seconds, limits, diagnoses, tr.own_use, tr.interval_ns)
    _net_lines(report, diagnoses, tr, g1)
    _memory_lines(report, host, diagnoses)
    report.lines.sort(key=lambda line: -(line.share or 0.0))
    return report
