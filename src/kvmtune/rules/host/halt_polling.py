from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.verifyplan import NoExperiment
from kvmtune.host.parsers import parse_int
from kvmtune.host.settings import KERNEL_HALT_POLL_NS, SEED_HALT_POLL_NS, halt_poll_want
from kvmtune.rules.host import HostFactsRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


class HaltPolling(HostFactsRule):
    id = "KVM-HST-011"
    slug = "halt-poll-ns-mismatch"
    topic = "halt-polling"
    severity = Severity.MEDIUM
    also_severities = (Severity.LOW,)  # what some findings are raised or lowered to
    title = "kvm.halt_poll_ns does not suit how loaded the host's CPUs are"
    why = (
        "Halt polling keeps an idle vCPU spinning for up to halt_poll_ns before it sleeps. Seed 002 found 80 µs "
        "gave transactional network tests up to 35 % more throughput, and warned it is counter-productive "
        "when CPUs are overcommitted: the spinning steals time other vCPUs need."
    )
    fix_kind = "modprobe"
    fix_description = (
        "echo N > /sys/module/kvm/parameters/halt_poll_ns (takes effect at once); persist with "
        "'options kvm halt_poll_ns=N' in /etc/modprobe.d/kvmtune.conf."
    )
    fix_safe = True
    references = (
        "seed:002 (halt_poll_ns 80,000 ns: up to 35 % better small-payload transactional results)",
        "Linux Documentation/virt/kvm/halt-polling.rst",
        "Linux arch/x86/include/asm/kvm_host.h: KVM_HALT_POLL_NS_DEFAULT 200000",
    )
    verify = NoExperiment("halt polling shortens idle KVM vCPUs' wake-ups at the cost of host CPU; it needs a latency "
                          "workload with idle gaps in a KVM guest, which the guest tier does not run (TCG has none)")

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        path = "/sys/module/kvm/parameters/halt_poll_ns"
        raw = facts.module_param("kvm", "halt_poll_ns")
        if raw is None:
            return  # kvm not loaded, or a kernel before halt polling (RHEL 6)
        try:
            value = parse_int(raw)
        except ValueError as exc:
            facts.problem(path, str(exc))
            return
        cpus = facts.cpu_count
        ratio = facts.guest_vcpus / cpus if cpus else None
        kvm_vcpus = sum(g.vcpus or 1 for g in facts.kvm_guests)
        target = self.at(ctx, "kvm:halt_poll_ns")
        wanted = halt_poll_want(facts, value)  # the host settings table decides; this says why
        if wanted is None:
            return
        if wanted[0] == 0:
            yield self.finding(
                target=target,
                actual=f"{value} ns with {facts.guest_vcpus} vCPUs ({kvm_vcpus} under KVM) on {cpus} CPUs "
                f"({ratio:.1f}:1)",
                expected="0 (or well below the 200 µs default) while vCPUs outnumber CPUs",
                evidence=path,
                summary="vCPUs halt-poll on an overcommitted host, taking CPU from runnable vCPUs",
            )
        elif value == 0:
            yield self.finding(
                target=target,
                severity=Severity.LOW,
                actual="0 (halt polling off)",
                expected=f"{SEED_HALT_POLL_NS} (seed 002) up to the kernel default {KERNEL_HALT_POLL_NS} on a host "
                "with idle CPUs",
                evidence=path,
                summary="Halt polling is off although the host has CPUs to spare",
            )
        else:
            yield self.finding(
                target=target,
                severity=Severity.LOW,
                actual=f"{value} ns",
                expected=f"≤ {KERNEL_HALT_POLL_NS} ns unless vCPUs are pinned to dedicated CPUs",
                evidence=path,
                summary="halt_poll_ns raised above the kernel default: idle vCPUs burn host CPU",
            )
