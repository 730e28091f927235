"""``kvmtune why``'s memory causes: swap, KSM merging, hugepages, and the balloon and PSI memory signals."""

from __future__ import annotations

import os

from kvmtune.audit.finding import Finding
from kvmtune.host.parsers import parse_count, parse_status_kib
from kvmtune.host.root import HostRoot
from kvmtune.live.diagnose import Diagnosis
from kvmtune.live.why.core import LIMITS, CatalogueRule, WhyLine, WhyReport, rule_fix, short_ids, verify_text
from kvmtune.live.why.tracker import Tracker

# the rules a memory cause names, from the catalogue
PINNED_MERGED = CatalogueRule("ksm-per-guest", "pinned-without-nosharepages")
LARGE_SMALL_PAGES = CatalogueRule("hugepages", "hugepages-large-guest")
SWAP = CatalogueRule("swap", "swap-in-use")
KSM_HOST = (CatalogueRule("ksm", "ksm-without-overcommit"), CatalogueRule("ksm", "ksm-off-with-overcommit"))


def _ksm_pages(host: HostRoot, pid: int) -> int | None:
    """The process's pages KSM merged: ``/proc/PID/ksm_merging_pages`` (Linux 6.1+), or ``ksm_stat``'s line."""
    pages = parse_count(host.read_optional(f"/proc/{pid}/ksm_merging_pages") or "")
    if pages is not None:
        return pages
    for line in (host.read_optional(f"/proc/{pid}/ksm_stat") or "").splitlines():
        key, _, value = line.partition(" ")
        if key == "ksm_merging_pages" and (pages := parse_count(value)) is not None:
            return pages
    return None


def _ksm_line(report: WhyReport, tr: Tracker | None, pid: int, share: float, findings: list[Finding]) -> None:
    ksmd = sum(used for per_cpu in (tr.use.values() if tr else ()) for o, used in per_cpu.items()
               if o.kind == "kernel" and o.name == "ksmd") / (tr.interval_ns if tr else 1)
    pinned = next((f for f in findings if f.rule == PINNED_MERGED.id), None)
    rule = pinned.rule if pinned else None
    report.lines.append(WhyLine(
        "memory", share, f"KSM merges {share:.0%} of the guest's memory",
        f"/proc/{pid}/ksm_merging_pages: {report.memory['ksm_kib'] // 1024} MiB; ksmd used {ksmd:.0%} of a CPU",
        "KSM: every write to a merged page is a copy-on-write fault" +
        ("; a pinned guest's pages merged across NUMA nodes" if pinned else ""), rule,
        rule_fix(rule) if rule else "<memoryBacking><nosharepages/> for this guest, or stop KSM where memory fits",
        verify_text(rule, report.target.name, "ksm_merging_pages should fall"),
        no_rule="" if rule else "no rule covers KSM sharing on an unpinned guest: it is a memory trade, "
        f"judged host-wide ({short_ids(KSM_HOST)})"))


def _hugepage_lines(report: WhyReport, findings: list[Finding]) -> None:
    mem = report.memory
    large = next((f for f in findings if f.rule == LARGE_SMALL_PAGES.id), None)
    if large is not None and not mem.get("hugetlb_kib") and (mem.get("thp_share") or 0.0) < 0.5:
        report.lines.append(WhyLine(
            "memory", None, "a large guest backed by small pages: no hugetlb pages, "
            f"{mem.get('thp_share') or 0.0:.0%} transparent huge pages",
            f"{large.actual}; HugetlbPages 0 kB", "TLB misses on 4 KiB pages", LARGE_SMALL_PAGES.id, large.fix.description,
            verify_text(LARGE_SMALL_PAGES.id, report.target.name, "HugetlbPages should equal the guest's memory")))


def memory_lines(report: WhyReport, host: HostRoot, diagnoses: list[Diagnosis], tr: Tracker | None = None,
                  findings: list[Finding] | None = None) -> None:
    pid = report.target.pid
    findings = findings or []
    if pid is not None:
        status = host.read_optional(f"/proc/{pid}/status") or ""
        rollup = host.read_optional(f"/proc/{pid}/smaps_rollup") or ""
        kib = parse_status_kib
        swap, anon, thp = kib(status, "VmSwap"), kib(rollup, "Anonymous"), kib(rollup, "AnonHugePages")
        hugetlb, ksm = kib(status, "HugetlbPages"), _ksm_pages(host, pid)
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
                "swap", SWAP.id, rule_fix(SWAP.id),
                verify_text(SWAP.id, report.target.name, "VmSwap should stay at 0")))
        if (report.memory["ksm_share"] or 0.0) >= LIMITS.ksm_share:
            _ksm_line(report, tr, pid, report.memory["ksm_share"], findings)
        _hugepage_lines(report, findings)
    for d in diagnoses:
        if d.signal in ("balloon", "psi-memory"):
            rule = d.rules[0] if d.rules else None
            report.lines.append(WhyLine(
                "memory", None, f"{d.signal}: {d.value} ({d.level}, threshold {d.threshold})", d.explanation, d.signal,
                rule, d.fix, verify_text(rule, report.target.name, "below the threshold"),
                no_rule="" if rule else "no rule covers it: no finding explains it"))
