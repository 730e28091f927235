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

One part per cause family: :mod:`.cpu`, :mod:`.disk`, :mod:`.net`, :mod:`.memory`, on the shared
:mod:`.core` (the report, the target, why's own thresholds, the rules taken from the catalogue by topic)
and :mod:`.tracker` (the per-tick sampling). This module samples and asks each part in turn.
"""

from __future__ import annotations

import time

from kvmtune.audit.thresholds import Thresholds
from kvmtune.errors import UsageError
from kvmtune.host.root import HostRoot
from kvmtune.live.diagnose import Diagnoser
from kvmtune.live.model import GuestSample
from kvmtune.live.signals import rates
from kvmtune.live.sources import Sampler, vcpu_index
from kvmtune.live.why.core import TICK_S, Target, WhyLine, WhyReport, find_target
from kvmtune.live.why.cpu import cpu_lines, quota_line, unnamed_cpu_line
from kvmtune.live.why.disk import DiskEdges, disk_extras, disk_lines, limits_libvirt, limits_qmp
from kvmtune.live.why.memory import memory_lines
from kvmtune.live.why.net import net_lines, read_link
from kvmtune.live.why.tracker import Tracker
from kvmtune.runner import Runner

__all__ = ["Target", "WhyLine", "WhyReport", "find_target", "why"]



# --- the whole ---------------------------------------------------------------------------------------


def _accel(tr: Tracker, sampler: Sampler, target: Target, g: GuestSample) -> str | None:
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
    tr = Tracker(host, target, vcpus)
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
    cpu_lines(tr, report, online, pinned, signal_rules, warn)
    unnamed_cpu_line(tr, report, signal_rules, warn)
    if target.pid is None and not g1.vcpus:
        report.not_measured["vcpu-delay"] = "the guest's QEMU process is not on this host and libvirt gave no vCPU delay"
    quota_line(tr, report)
    limits = (limits_libvirt(sampler, target, list(g1.disks)) if target.libvirt
              else limits_qmp(sampler, target.pid) if target.pid else {})
    disk_lines(report, g0, g1, report.seconds, limits, diagnoses, tr.own_use, tr.interval_ns)
    disk_extras(report, host, g1, edges, findings)
    net_lines(report, diagnoses, tr, g0, g1, links0, links1)
    memory_lines(report, host, diagnoses, tr, findings)
    report.lines.sort(key=lambda line: -(line.share or 0.0))
    return report
