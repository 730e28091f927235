from __future__ import annotations

from collections.abc import Iterator

from kvmtune.audit.context import AuditContext
from kvmtune.audit.finding import Finding, Severity
from kvmtune.host.facts import HostFacts
from kvmtune.host.parsers import parse_int
from kvmtune.rules.host import HostFactsRule

KERNEL_DEFAULT_NS = 200_000  # KVM_HALT_POLL_NS_DEFAULT on x86
SEED_NS = 80_000


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
        # every running vCPU competes for the CPUs, but only KVM vCPUs poll
        ratio = facts.guest_vcpus / cpus if cpus else None
        kvm_vcpus = sum(g.vcpus or 1 for g in facts.kvm_guests)
        target = self.at(ctx, "kvm:halt_poll_ns")
        if ratio is not None and ratio > 1.0 and value > 0 and kvm_vcpus:
            yield self.finding(
                target=target,
                actual=f"{value} ns with {facts.guest_vcpus} vCPUs ({kvm_vcpus} under KVM) on {cpus} CPUs "
                f"({ratio:.1f}:1)",
                expected="0 (or well below the 200 µs default) while vCPUs outnumber CPUs",
                evidence=path,
                summary="vCPUs halt-poll on an overcommitted host, taking CPU from runnable vCPUs",
            )
        elif (ratio is None or ratio <= 1.0) and value == 0 and kvm_vcpus:
            yield self.finding(
                target=target,
                severity=Severity.LOW,
                actual="0 (halt polling off)",
                expected=f"{SEED_NS} (seed 002) up to the kernel default {KERNEL_DEFAULT_NS} on a host with idle CPUs",
                evidence=path,
                summary="Halt polling is off although the host has CPUs to spare",
            )
        elif value > KERNEL_DEFAULT_NS:
            yield self.finding(
                target=target,
                severity=Severity.LOW,
                actual=f"{value} ns",
                expected=f"≤ {KERNEL_DEFAULT_NS} ns unless vCPUs are pinned to dedicated CPUs",
                evidence=path,
                summary="halt_poll_ns raised above the kernel default: idle vCPUs burn host CPU",
            )
