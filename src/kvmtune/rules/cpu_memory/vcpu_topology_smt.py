from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.domain.cputune import cpu_layout

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class VcpuTopologySmt(GuestRule):
    id = "KVM-CPU-023"
    slug = "vcpu-topology-vs-host-smt"
    topic = "vcpu-pinning"
    judges_only = "on_audited_host"
    severity = Severity.MEDIUM
    title = "Pinned vCPUs sit on host SMT siblings the guest's topology does not show (or the reverse)"
    why = (
        "Two hyperthreads of one core share its execution units and caches. A guest told threads='1' whose vCPUs "
        "are pinned onto sibling pairs schedules two busy tasks 'on different cores' that in fact compete for one; "
        "a guest told threads='2' whose vCPU pairs land on different cores idles one sibling for nothing. Its "
        "scheduler can only place work well if <topology> mirrors where the vCPUs really run."
    )
    fix_kind = "manual"
    fix_description = (
        "Pin vCPU pairs (0,1), (2,3), … onto host sibling pairs and declare <topology sockets='1' cores='N/2' "
        "threads='2'/>, or pin every vCPU to a different core (one sibling each) and keep threads='1'. Not "
        "automatic: the topology is guest-visible (scheduling domains, per-socket/core licences) and which host "
        "CPUs a guest gets is the host's CPU plan."
    )
    references = (
        "libvirt formatdomain 'CPU model and topology': <topology sockets cores threads>",
        "OpenStack Nova flavor extra specs: hw:cpu_thread_policy (prefer, isolate, require), hw:cpu_threads",
        "RHEL 9 'Configuring and managing virtualization': 'Configuring virtual CPU pinning' (match the host topology)",
        "Linux Documentation/ABI/stable/sysfs-devices-system-cpu: topology/thread_siblings_list",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        if not guest.vcpu_pinned or not guest.on_audited_host:
            return
        layout = cpu_layout(guest)
        if layout is None or len(layout.vcpupins) < 2:
            return
        siblings = ctx.facts.thread_siblings
        if not siblings or all(len(s) == 1 for s in siblings.values()):
            return  # no SMT on this host: every topology is honest
        single = {v: next(iter(cpus)) for v, cpus in layout.vcpupins.items() if len(cpus) == 1}
        threads = layout.topology.get("threads", 1)
        evidence = "/domain/cputune/vcpupin, /domain/cpu/topology/@threads; host: cpu*/topology/thread_siblings_list"
        if threads == 1:
            core: dict[frozenset[int], list[int]] = {}
            for vcpu, cpu in sorted(single.items()):
                if cpu in siblings:
                    core.setdefault(siblings[cpu], []).append(vcpu)
            shared = [(sorted(group), sorted({single[v] for v in group})) for group in core.values() if len(group) > 1]
            shared = [(vs, cpus) for vs, cpus in shared if len(cpus) > 1]  # one CPU twice is CPU-020's overcommit
            if not shared:
                return
            vcpus, cpus = shared[0]
            yield self.finding(
                target=self.target(guest, "cpu-topology"),
                actual=f"threads=1, but vCPUs {','.join(map(str, vcpus))} are pinned to SMT siblings "
                f"{','.join(map(str, cpus))} ({len(shared)} such core(s))",
                expected="threads='2' with sibling pairs as consecutive vCPUs, or one sibling per vCPU",
                evidence=evidence,
                source=guest.origin,
            )
            return
        if not single:
            return  # every vCPU floats over several CPUs: no vCPU sits on a particular sibling
        broken = []
        for first in range(0, max(single) + 1, threads):
            group = [v for v in range(first, first + threads) if v in single]
            placed = {single[v] for v in group}
            if len(group) == threads and not any(placed <= s for s in siblings.values()):
                broken.append(group)
        if broken:
            yield self.finding(
                target=self.target(guest, "cpu-topology"),
                actual=f"threads={threads}, but vCPUs {','.join(map(str, broken[0]))} are pinned to different cores "
                f"({len(broken)} such group(s))",
                expected=f"each group of {threads} consecutive vCPUs pinned to one core's siblings",
                evidence=evidence,
                source=guest.origin,
            )
