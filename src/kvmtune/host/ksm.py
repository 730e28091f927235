"""Kernel Samepage Merging: what it is doing on a host, and whether it pays (``kvmtune ksm``'s advisor).

:func:`build_report` reads :class:`~kvmtune.host.facts.HostFacts` (whose running guests come from the
finder the caller gave it) into a :class:`KsmReport`; :func:`advise` turns the report into advice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvmtune.host.facts import HostFacts

# ksm.rst: "a high ratio of pages_sharing to pages_shared indicates good sharing, but a high ratio of
# pages_unshared to pages_sharing indicates wasted effort".
GOOD_SHARING = 2.0
WASTEFUL = 2.0


@dataclass
class KsmReport:
    available: bool
    run: int | None = None
    state: str = "unknown"
    counters: dict[str, int | None] = field(default_factory=dict)
    page_size: int = 4096
    sharing_ratio: float | None = None
    waste_ratio: float | None = None
    volatile_ratio: float | None = None
    saved_bytes: int | None = None
    general_profit_bytes: int | None = None
    scan_pages_per_s: float | None = None
    ksmd_cpu_percent: float | None = None
    numa_nodes: int = 0
    guests: int = 0
    guest_memory_kib: int = 0
    mem_total_kib: int | None = None
    memory_ratio: float | None = None
    ksmtuned_thres_coef: int | None = None  # a Proxmox VE node whose ksmtuned starts and stops KSM: its threshold
    advice: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


RUN_STATES = {0: "stopped (shared pages stay merged)", 1: "running", 2: "stopped, all pages unmerged"}


def build_report(facts: HostFacts) -> KsmReport:
    ksm = facts.ksm
    rep = KsmReport(available=ksm is not None, page_size=facts.page_size, errors=facts.errors)
    rep.guests = len(facts.guests)
    rep.guest_memory_kib = facts.guest_memory_kib
    rep.mem_total_kib = facts.mem_total_kib
    rep.memory_ratio = facts.memory_ratio
    rep.numa_nodes = len(facts.numa_nodes)
    if facts.ksmtuned_manages_ksm():
        rep.ksmtuned_thres_coef = facts.ksmtuned_thres_coef
    if ksm is None:
        rep.state = "not available (kernel without CONFIG_KSM, or /sys/kernel/mm/ksm missing)"
        rep.advice.append("KSM is not available; memory overcommit has to come from ballooning or fewer guests.")
        return rep
    rep.run = ksm.run
    rep.state = RUN_STATES.get(ksm.run, f"run={ksm.run}") if ksm.run is not None else "unknown"
    rep.counters = {name: getattr(ksm, name) for name in ksm.FIELDS}
    rep.sharing_ratio = ksm.sharing_ratio
    rep.waste_ratio = ksm.waste_ratio
    if ksm.pages_volatile is not None and ksm.pages_sharing:
        rep.volatile_ratio = ksm.pages_volatile / ksm.pages_sharing
    rep.saved_bytes = ksm.saved_bytes(facts.page_size)
    if ksm.general_profit is not None:
        rep.general_profit_bytes = ksm.general_profit
    if ksm.pages_to_scan and ksm.sleep_millisecs is not None:
        rep.scan_pages_per_s = ksm.pages_to_scan * 1000.0 / max(ksm.sleep_millisecs, 1)
    rep.ksmd_cpu_percent = facts.ksmd_cpu_percent()
    rep.advice = advise(rep)
    return rep


def advise(rep: KsmReport) -> list[str]:
    out: list[str] = []
    ratio = rep.memory_ratio
    c = rep.counters
    running = rep.run == 1
    coef = rep.ksmtuned_thres_coef
    cpu = f" ksmd has used {rep.ksmd_cpu_percent:.1f} % of a CPU since boot." if rep.ksmd_cpu_percent else ""
    if running and rep.guests and ratio is not None and ratio < 0.9 and coef is None:
        out.append(
            f"Guests' memory ({ratio:.2f}× RAM) fits without KSM: it costs CPU and splits huge pages for savings "
            f"the host does not need.{cpu} Consider echo 2 > /sys/kernel/mm/ksm/run (KVM-HST-005)."
        )
    elif running and rep.guests and ratio is not None and coef is not None and ratio < min(0.9, 1 - coef / 100):
        out.append(
            f"Guests' memory ({ratio:.2f}× RAM) fits without KSM, but this Proxmox VE node's ksmtuned started it: "
            f"less than KSM_THRES_COEF={coef} % of RAM is free to it.{cpu} Writing to ksm/run lasts only until its "
            "next check; lower KSM_THRES_COEF in /etc/ksmtuned.conf, or systemctl disable --now ksmtuned and "
            "echo 2 > /sys/kernel/mm/ksm/run (KVM-HST-005)."
        )
    if not running and ratio is not None and ratio > 1.0:
        out.append(
            f"Guests are promised {ratio:.2f}× the host's RAM but KSM is not running: start it (or ksmtuned) before "
            "the host has to swap (KVM-HST-006)."
        )
    if running and c.get("full_scans") == 0:
        out.append("KSM has not finished one full scan yet: the figures below are not final.")
    if rep.sharing_ratio is not None and running and rep.sharing_ratio < GOOD_SHARING:
        out.append(
            f"Each shared page backs only {rep.sharing_ratio:.1f} guest pages: little duplication to find "
            "(different guest OSes, encrypted or random data)."
        )
    if rep.waste_ratio is not None and rep.waste_ratio > WASTEFUL:
        out.append(
            f"KSM scans {rep.waste_ratio:.1f} unique pages for every page it shares: mostly wasted effort. "
            "Raise sleep_millisecs, or exclude guests with <memoryBacking><nosharepages/>."
        )
    if rep.volatile_ratio is not None and rep.volatile_ratio > 1.0:
        out.append(
            "More pages change too fast to merge (pages_volatile) than are shared: the guests' memory is busy; "
            "KSM gains little here."
        )
    if running and rep.numa_nodes > 1 and c.get("merge_across_nodes") == 1:
        out.append(
            f"merge_across_nodes=1 on {rep.numa_nodes} NUMA nodes: shared pages become remote memory for some "
            "guests. Set it to 0 (needs run=2 first) (KVM-HST-007)."
        )
    if not out:
        out.append("Nothing to change: KSM's state matches how much memory the guests are promised.")
    return out
