from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.host.settings import DEEP_CSTATE_US, LATENCY_TUNED_PROFILES
from kvmtune.rules.host import HostFactsRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts

# kernel parameters that keep CPUs out of deep idle states for good
CSTATE_LIMITS = ("intel_idle.max_cstate", "processor.max_cstate")


class DeepCstates(HostFactsRule):
    id = "KVM-HST-041"
    slug = "deep-cstates-latency-host"
    topic = "cpu-power"
    severity = Severity.MEDIUM
    title = "Deep C-states stay reachable on a host tuned for latency"
    why = (
        "Waking a core from a deep idle state takes tens to hundreds of microseconds, added to every interrupt "
        "a sleeping vCPU receives. tuned's latency-performance (and the network-latency and realtime profiles "
        "built on it) holds /dev/cpu_dma_latency so that only C1 is used; without the tuned daemon or a kernel "
        "limit that request is gone."
    )
    fix_kind = "manual"
    fix_description = (
        "Run the tuned daemon with the latency profile (it holds /dev/cpu_dma_latency open), or boot with "
        "intel_idle.max_cstate=1 processor.max_cstate=1. kvmtune does not change the kernel command line or hold "
        "the PM QoS device itself: the first needs a reboot, the second a daemon that lives as long as the request."
    )
    fix_safe = False
    references = (
        "tuned profiles/latency-performance/tuned.conf: [cpu] force_latency=cstate.id_no_zero:1|3",
        "Documentation/admin-guide/pm/cpuidle.rst (PM QoS, /dev/cpu_dma_latency, idle state 'latency')",
        "Documentation/admin-guide/kernel-parameters.txt: intel_idle.max_cstate, processor.max_cstate",
        "RHEL 9 Optimizing virtual machine performance: tuned profiles for latency",
    )

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        profile = facts.tuned_profile
        isolated = bool(facts.cmdline_cpus("isolcpus", "nohz_full"))
        if profile not in LATENCY_TUNED_PROFILES and not isolated:
            return  # nobody asked this host for low latency
        if facts.process_running("tuned") and profile in LATENCY_TUNED_PROFILES:
            return  # the daemon holds the PM QoS request
        cmdline = facts.kernel_cmdline
        if "idle" in cmdline and cmdline["idle"] == "poll":
            return
        if any(_at_most_one(cmdline.get(p)) for p in CSTATE_LIMITS):
            return
        deep = [s for s in facts.cpuidle_states if s.latency_us > DEEP_CSTATE_US and not s.disabled]
        if not deep:
            return
        worst = max(deep, key=lambda s: s.latency_us)
        why_latency = f"tuned profile {profile}" if profile in LATENCY_TUNED_PROFILES else "isolcpus/nohz_full"
        yield self.finding(
            target=self.at(ctx, "cpuidle"),
            actual=(f"{', '.join(s.name or s.entry for s in deep)} enabled (up to {worst.latency_us} µs to wake) "
                    f"on a host set up for latency ({why_latency}), no tuned daemon holding cpu_dma_latency"),
            expected=f"only states waking within {DEEP_CSTATE_US} µs (C1), as tuned latency-performance asks",
            evidence="/sys/devices/system/cpu/cpu0/cpuidle/state*/{name,latency,disable}; /proc/cmdline; "
                     "/etc/tuned/active_profile; /proc/*/comm",
        )


def _at_most_one(value: str | None) -> bool:
    try:
        return value is not None and int(value) <= 1
    except ValueError:
        return False
