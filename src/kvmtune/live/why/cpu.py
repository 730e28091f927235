"""``kvmtune why``'s CPU causes: who ran on the CPUs a vCPU waited for (pinning overlap, overcommit, the guest's own
QEMU threads, a host process), the bound on an unmeasured wait, CPU quota throttling."""

from __future__ import annotations

from kvmtune.live.threads import Owner
from kvmtune.live.why.core import LIMITS, VCPU_WARN, CatalogueRule, Target, WhyLine, WhyReport, rule_fix, verify_text
from kvmtune.live.why.tracker import Tracker, Vcpu, allowed_cpus

# --- CPU ---------------------------------------------------------------------------------------------


# the rules a CPU cause names, from the catalogue
EMULATOR_ON_VCPUS = CatalogueRule("vcpu-pinning", "emulatorpin-on-vcpu-cpus")
PINNED_SHARED = CatalogueRule("vcpu-pinning", "guests-pinned-to-same-cpus")
OVERCOMMIT = CatalogueRule("vcpu-overcommit", "vcpu-overcommit-high")
NOT_ISOLATED = CatalogueRule("cpu-isolation", "pinned-cpus-not-isolated")


def _thieves(tr: Tracker, v: Vcpu) -> list[tuple[Owner, float]]:
    """Owners that used the CPUs this vCPU waited on, weighted by where it waited, as a share of the interval."""
    total_wait = sum(v.waits.values()) or 1
    score: dict[Owner, float] = {}
    for cpu, waited in v.waits.items():
        for owner, used in tr.use.get(cpu, {}).items():
            if owner.kind == "guest-vcpu" and owner.pid == tr.pid and owner.detail == f"vCPU {v.index}":
                continue
            score[owner] = score.get(owner, 0.0) + waited / total_wait * used / tr.interval_ns
    return sorted(score.items(), key=lambda kv: -kv[1])


def _cpu_cause(tr: Tracker, v: Vcpu, owner: Owner, online: int | None, target: Target,
               pinned_in_definition: bool) -> tuple[str, str | None, str, str]:
    """(cause, rule, no-rule reason, fix) for the neighbour that ran most on this vCPU's CPUs."""
    mine_pinned = v.allowed is not None and online is not None and len(v.allowed) < online
    if owner.pid == tr.pid and owner.kind in ("qemu", "vhost"):
        return ("the guest's own QEMU threads (emulator, I/O, vhost) share its vCPUs' CPUs", EMULATOR_ON_VCPUS.id, "",
                rule_fix(EMULATOR_ON_VCPUS.id) or "pin the emulator threads (<emulatorpin>) away from the vCPUs")
    if owner.kind in ("guest-vcpu", "qemu", "vhost"):
        tid = tr.sample_tid.get(owner)
        theirs = allowed_cpus(tr.host, owner.pid, tid) if tid else None
        their_pinned = theirs is not None and online is not None and len(theirs) < online
        if mine_pinned and their_pinned:
            cpus = ",".join(str(c) for c in sorted((v.allowed or frozenset()) & (theirs or frozenset())))
            cause = f"pinning overlap: both are confined to host CPU(s) {{{cpus}}}"
            if pinned_in_definition:
                return cause, PINNED_SHARED.id, "", rule_fix(PINNED_SHARED.id) or "give each guest its own host CPUs"
            return (cause, None, "no rule covers affinity set outside libvirt (taskset, a cgroup cpuset): the audit "
                    "cannot see it in a definition",
                    f"give {target.name} and {owner.name} host CPUs of their own (taskset -pc, cpuset), or fewer vCPUs")
        return ("overcommit: more runnable vCPUs than host CPUs", OVERCOMMIT.id, "",
                rule_fix(OVERCOMMIT.id) or "fewer vCPUs, or fewer guests on this host")
    what = f"host process {owner.name}" if owner.kind == "process" else f"kernel thread {owner.name}"
    if mine_pinned:
        return (f"{what} runs on the guest's pinned CPUs", NOT_ISOLATED.id, "",
                f"move {owner.name} off CPU(s) {_cpus(v.allowed)} (taskset, systemd CPUAffinity=), "
                "or isolate the guests' CPUs (isolcpus / nohz_full)")
    return (f"{what} competes for the same CPUs", None, _NO_RULE_PROCESS,
            f"move {owner.name} off the guest's CPUs (taskset, systemd CPUAffinity=), or pin the guest away from it")


def _cpus(cpus: frozenset[int] | None) -> str:
    return ",".join(str(c) for c in sorted(cpus)) if cpus else "any"


def cpu_lines(tr: Tracker, report: WhyReport, online: int | None, pinned_in_definition: bool,
               signal_rules: tuple[list[str], str] = ([], ""), warn: float = VCPU_WARN) -> None:
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
        if not thieves or thieves[0][1] < LIMITS.cpu_cause_min:
            report.lines.append(WhyLine(
                "cpu", delay, head, f"{waited / total_wait:.0%} of the wait was on CPU {where}; no thread seen there "
                "used it for 5 % of the interval", "not seen: the wait has no neighbour kvmtune could see",
                None, "", verify_text(None, name, "the wait should fall below 5 %"),
                no_rule="no rule covers a wait with no visible neighbour (short-lived processes, interrupts)"))
            continue
        owner = thieves[0][0]
        used_there = tr.use.get(where, {}).get(owner, 0) / interval
        evidence = (f"{waited / total_wait:.0%} of the wait was on CPU {where}, which {owner.label()} used for "
                    f"{used_there:.0%} of the interval")
        if len(thieves) > 1 and thieves[1][1] >= LIMITS.cpu_cause_min:
            evidence += f"; also {thieves[1][0].label()} ({thieves[1][1]:.0%})"
        cause, rule, no_rule, fix = _cpu_cause(tr, v, owner, online, report.target, pinned_in_definition)
        rule, no_rule, cause = _signal_rule(rule, no_rule, cause, signal_rules)
        report.lines.append(WhyLine("cpu", delay, f"{head}: waits for {owner.name}", evidence, cause, rule, fix,
                                    verify_text(rule, name, "the wait should fall below 5 %"), no_rule=no_rule))


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


def unnamed_cpu_line(tr: Tracker, report: WhyReport, signal_rules: tuple[list[str], str],
                      warn: float = VCPU_WARN) -> None:
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
        rules[0] if rules else None, fix, verify_text(rules[0] if rules else None, report.target.name,
                                                 "the wait should fall below 5 %"),
        no_rule="" if rules else "no finding of the audit is in the vcpu-delay signal's topics for this guest"))


def quota_line(tr: Tracker, report: WhyReport) -> None:
    a, b = tr.cg_start, tr.cg_end
    for resource in ("cpu", "io", "memory"):
        key = f"psi.{resource}"
        if key in a and key in b:
            report.psi[resource] = (b[key] - a[key]) * 1000 / tr.interval_ns
    throttled = (b.get("cpu.throttled_usec", 0) - a.get("cpu.throttled_usec", 0)) * 1000 / tr.interval_ns
    periods = b.get("cpu.nr_throttled", 0) - a.get("cpu.nr_throttled", 0)
    if periods > 0 and throttled >= VCPU_WARN:
        report.lines.append(WhyLine(
            "cpu", throttled, f"its cgroup was throttled by a CPU quota for {throttled:.0%} of the interval",
            f"{tr.cgroup}/cpu.stat: nr_throttled +{periods}, throttled_usec +{throttled * tr.interval_ns / 1000:.0f}",
            "CPU quota throttling (cpu.max)", None,
            "raise or remove the quota (libvirt <cputune><quota>/<period>, virsh schedinfo; systemd CPUQuota=)",
            verify_text(None, report.target.name, "nr_throttled should stop growing"),
            no_rule="no rule covers a CPU quota: it is set on purpose"))
