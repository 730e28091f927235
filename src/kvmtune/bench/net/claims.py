"""Seed 002's claims that ``kvmtune bench net`` can measure, judged from stored network cells.

Each claim compares two configurations that differ in one thing (the topology, or the MTU) and agree on
the rest (MTU, host count, pairs, tunings, tier, accelerator). A run is one sample: within it, pairs are
summed (throughput, transactions/s) or averaged (times), and the tests both sides ran are folded into one
geometric mean, so a test with large numbers does not outweigh one with small numbers. With two or more
runs a side, the ratio gets a 95 % interval (Welch on the log scale, :func:`kvmtune.bench.verdicts.ratio`)
and a claim holds or fails only when the interval settles it against the claim's band
(:mod:`kvmtune.lab.vocabulary`); with one run a side it is inconclusive. A comparison on another
mechanism than the seed's (Open vSwitch's userspace datapath, TCG guests) is "not comparable".

The seed's figures (seed:002, IBM "KVM Network Performance — Best Practices and Tuning Recommendations",
2016/2018) are quoted with their page and figure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvmtune.bench.net.chart import aggregate
from kvmtune.bench.verdicts import (
    TCG_NOT_SEED,
    VIRTIO_VS_IDE_SLUG,
    Ratio,
    Verdict,
    ratio,
    seed000_verified,
    verified_cells,
    verified_ratio,
    verified_subject,
    verified_where,
)
from kvmtune.lab.store import CellRow
from kvmtune.lab.vocabulary import (
    DOES_NOT_HOLD,
    HELPS,
    HOLDS,
    HURTS,
    INCONCLUSIVE,
    NO_EFFECT,
    NOT_COMPARABLE,
    NOT_MEASURED,
    at_least,
    decided,
    within,
)

RR_SMALL = ("rr1c-1x1", "rr1c-200x1000")
RR_LARGE = ("rr1c-1000x30k",)
STREAM = ("str-readx30k", "str-writex30k")
PAYLOAD_30K = ("rr1c-1000x30k", "str-readx30k", "str-writex30k")
LARGE_MTU = 8000  # seed 002 compares 8192 (and 9000-class) against 1492/1500


@dataclass(frozen=True)
class NetClaim:
    seed: str  # "seed:002 p. 33"
    claim: str
    figure: str  # the seed's number as it states it
    measured: str | None  # None: not measured by these runs
    badge: str  # a word of kvmtune.lab.vocabulary
    hint: str = ""  # how to measure it, when not measured

    def line(self, tier: str) -> str:
        if self.measured is None:
            return f"{self.seed} [{tier}]: {self.claim} — not measured in these runs ({self.hint})"
        return f"{self.seed} [{tier}]: {self.badge}: {self.measured} (seed: {self.claim})"


def net_tier(cell: CellRow) -> str:
    """guest (netload between probe guests) or datapath (netload in the namespaces, no QEMU)."""
    tier = cell.config.get("tier")
    return tier if isinstance(tier, str) else "guest"


def _tunings(config: dict[str, Any]) -> str:
    tune = config.get("tunings") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(tune.items())) if isinstance(tune, dict) else str(tune)


@dataclass(frozen=True)
class Setup:
    topology: str
    mtu: int
    hosts: int
    pairs: int
    tunings: str
    ovs_datapath: str = ""  # Open vSwitch only: system (kernel module, as in seed 002) or netdev (userspace)

    @staticmethod
    def of(cell: CellRow) -> Setup:
        c = cell.config
        ovs = str(c.get("ovs_datapath") or "") if c.get("topology") == "ovs" else ""
        return Setup(str(c.get("topology", "?")), int(c.get("mtu", 0) or 0), int(c.get("hosts", 1) or 1),
                     int(c.get("pairs", 1) or 1), _tunings(c), ovs)

    @property
    def name(self) -> str:
        """The topology as a reader needs it: Open vSwitch's userspace datapath is not the kernel's."""
        return "ovs (userspace)" if self.ovs_datapath == "netdev" else self.topology


def seed_figure_metric(test: str) -> str:
    """The figure seed 002 ranks a test by: transactions/s for request/response, bytes/s for streaming."""
    return "tps" if test.startswith("rr") else "throughput_Bps"


def per_run(cells: Sequence[CellRow]) -> dict[Setup, dict[int, dict[str, dict[str, float]]]]:
    """setup → run id → test → metrics (pairs summed or averaged as the catalogue says)."""
    by: dict[Setup, dict[int, list[CellRow]]] = {}
    for c in cells:
        if c.status == "ok" and "topology" in c.config:
            by.setdefault(Setup.of(c), {}).setdefault(c.run_id, []).append(c)
    return {s: {rid: aggregate(cs) for rid, cs in runs.items()} for s, runs in by.items()}


@dataclass(frozen=True)
class Comparison:
    subject: Setup
    reference: Setup
    ratio: Ratio  # subject's figure / reference's figure (> 1: subject moved more)
    tests: tuple[str, ...]

    def describe(self, what: str) -> str:
        n = len(self.tests)
        r = self.ratio
        where = f"{n} test{'s' if n > 1 else ''}"
        if r.low is None or r.high is None:
            spread = f"no interval: fewer than 2 runs a side; {where}"
        else:
            spread = f"95 % interval {_pct(r.low)} to {_pct(r.high)}, {r.n} runs a side; {where}"
        return f"{what}: {_pct(r.value)} ({spread})"


def _pct(r: float) -> str:
    return f"{100 * (r - 1):+.0f} %"


def compare(data: dict[Setup, dict[int, dict[str, dict[str, float]]]], subject: Setup, reference: Setup,
            workloads: Sequence[str] | None, metric: Callable[[str], str] | str) -> Comparison | None:
    """Subject against reference over the tests both ran (every run of each), as one ratio of geometric means."""
    runs_s, runs_r = data.get(subject, {}), data.get(reference, {})
    if not runs_s or not runs_r:
        return None
    common = set.intersection(*(set(t) for t in [*runs_s.values(), *runs_r.values()]))
    tests = sorted(t for t in common if workloads is None or t.partition("--")[0] in workloads)

    def score(run: dict[str, dict[str, float]]) -> float | None:
        vals = [run[t].get(metric(t) if callable(metric) else metric, 0.0) for t in tests]
        if not vals or any(v <= 0 for v in vals):
            return None
        return math.exp(sum(math.log(v) for v in vals) / len(vals))

    s_scores = [v for v in (score(r) for r in runs_s.values()) if v is not None]
    r_scores = [v for v in (score(r) for r in runs_r.values()) if v is not None]
    got = ratio(s_scores, r_scores) if s_scores and r_scores else None
    return None if got is None else Comparison(subject, reference, got, tuple(tests))


def _interval(r: Ratio) -> tuple[float, float] | None:
    return None if r.low is None or r.high is None else (r.low, r.high)


def judge_better(r: Ratio, bound: float) -> str:
    """The subject is claimed better by at least ``bound`` (1.10 = 10 %): the whole interval must say so."""
    return at_least(_interval(r), bound)


def judge_within(r: Ratio, band: float) -> str:
    """The two are claimed equal within ``band`` (0.10 = ±10 %): the whole interval inside, or wholly outside."""
    return within(_interval(r), 1 / (1 + band), 1 + band)


SEED_MECHANISM = "seed 002 measured Open vSwitch's kernel datapath"


def not_comparable(*setups: Setup) -> str | None:
    """Why a comparison of these setups is not the seed's, or None when it is."""
    if any(s.ovs_datapath == "netdev" for s in setups):
        return f"Open vSwitch's userspace datapath (netdev) here; {SEED_MECHANISM} (system)"
    return None


def _pairs(data: dict[Setup, Any], subject: Callable[[Setup], bool], reference: Callable[[Setup, Setup], bool]
           ) -> list[tuple[Setup, Setup]]:
    return [(s, r) for s in sorted(data, key=str) if subject(s) for r in sorted(data, key=str) if r != s and reference(s, r)]


def _same_but_topology(a: Setup, b: Setup) -> bool:
    return (a.mtu, a.hosts, a.pairs, a.tunings) == (b.mtu, b.hosts, b.pairs, b.tunings)


def _topologies(tier: str, *kinds: str) -> str:
    """The datapath tier takes a list and interleaves the topologies in one run; the guest tier one per run."""
    if "datapath" in tier:
        return "--topology " + ",".join(kinds)
    return " and ".join(f"--topology {k}" for k in kinds) + " (one run each)"


def _worst(badges: Sequence[str]) -> str:
    order = (DOES_NOT_HOLD, INCONCLUSIVE, HOLDS)
    return min(badges, key=order.index)


def _verdict(seed: str, claim: str, figure: str, found: Sequence[tuple[Comparison, str]], what: Callable[[Comparison], str]
             ) -> NetClaim:
    """Comparable comparisons decide the badge; the others are named with their reason."""
    fair = [(c, b) for c, b in found if not_comparable(c.subject, c.reference) is None]
    unfair = [(c, why) for c, _ in found if (why := not_comparable(c.subject, c.reference)) is not None]
    bits = [c.describe(what(c)) + f": {b}" for c, b in fair]
    bits += [f"{what(c)}: {NOT_COMPARABLE} ({why})" for c, why in unfair]
    return NetClaim(seed, claim, figure, "; ".join(bits), _worst([b for _, b in fair]) if fair else NOT_COMPARABLE)


def macvtap_beats_bridges(data: dict[Setup, Any], tier: str = "") -> NetClaim:
    claim = "macvtap moves 10–50 % more transactions per second than either software bridge (Linux bridge, Open vSwitch)"
    seed, figure = "seed:002 p. 33", "+10 to +50 %"
    found = []
    for s, r in _pairs(data, lambda s: s.topology == "macvtap",
                       lambda s, r: r.topology in ("bridge", "ovs") and _same_but_topology(s, r)):
        c = compare(data, s, r, (*RR_SMALL, *RR_LARGE), "tps")
        if c is not None:
            found.append((c, judge_better(c.ratio, 1.10)))
    if not found:
        return NetClaim(seed, claim, figure, None, NOT_MEASURED,
                        f"run bench net{tier} {_topologies(tier, 'macvtap', 'bridge', 'ovs')} with the same "
                        "request/response tests, MTU and hosts")
    return _verdict(seed, claim, figure, found, lambda c: f"macvtap vs {c.reference.name}, MTU {c.reference.mtu}, tx/s")


def bridge_near_ovs(data: dict[Setup, Any], tier: str = "") -> NetClaim:
    claim = "the Linux bridge performs within 10 % of Open vSwitch"
    seed, figure = "seed:002 p. 38", "±10 %"
    found = []
    for s, r in _pairs(data, lambda s: s.topology == "bridge",
                       lambda s, r: r.topology == "ovs" and _same_but_topology(s, r)):
        c = compare(data, s, r, None, seed_figure_metric)
        if c is not None:
            found.append((c, judge_within(c.ratio, 0.10)))
    if not found:
        return NetClaim(seed, claim, figure, None, NOT_MEASURED,
                        f"run bench net{tier} {_topologies(tier, 'bridge', 'ovs')} with the same tests, MTU and hosts")
    return _verdict(seed, claim, figure, found, lambda c: f"bridge vs {c.reference.name}, MTU {c.reference.mtu}, tx/s or B/s")


def large_mtu_helps(data: dict[Setup, Any], hosts: int, tier: str = "") -> NetClaim:
    if hosts == 1:
        claim = "on one host, a large MTU improves the 30 KB-payload tests by up to 120 %"
        seed, figure, bound, workloads = "seed:002 p. 51, fig. 17", "up to +120 %", 1.05, PAYLOAD_30K
    else:
        claim = "across two hosts, a large MTU gives 5–20 % more throughput and shorter transactions"
        seed, figure, bound, workloads = "seed:002 p. 52, fig. 18", "+5 to +20 %", 1.05, None
    found = []
    for s, r in _pairs(data, lambda s: s.mtu >= LARGE_MTU and s.hosts == hosts,
                       lambda s, r: r.mtu <= 1500 and (s.topology, s.ovs_datapath, s.hosts, s.pairs, s.tunings)
                       == (r.topology, r.ovs_datapath, r.hosts, r.pairs, r.tunings)):
        c = compare(data, s, r, workloads, seed_figure_metric)
        if c is not None:
            found.append((c, judge_better(c.ratio, bound)))
    if not found:
        return NetClaim(seed, claim, figure, None, NOT_MEASURED,
                        f"run bench net{tier} --hosts {hosts} once with --mtu 9000 and once with --mtu 1500, same "
                        "topology and tests (str-readx30k, rr1c-1000x30k)")
    return _verdict(seed, claim, figure, found, lambda c: f"{c.subject.name} MTU {c.subject.mtu} vs {c.reference.mtu}")


CATEGORIES = (("small transactions", RR_SMALL, "tps"), ("large transactions", RR_LARGE, "tps"),
              ("streaming", STREAM, "throughput_Bps"))


@dataclass(frozen=True)
class Winner:
    best: str
    lead: Ratio  # best's per-run scores against the runner-up's (geometric means, 95 % interval)
    second: str
    tests: int

    @property
    def decided(self) -> bool:
        """A winner is named only when the interval excludes a tie."""
        return decided(_interval(self.lead))

    def text(self) -> str:
        r = self.lead
        spread = ("one run a side, no interval" if r.low is None or r.high is None
                  else f"95 % interval {_pct(r.low)} to {_pct(r.high)}")
        tests = f"{self.tests} test{'s' if self.tests > 1 else ''}"
        if self.decided:
            return f"{self.best} ({_pct(r.value)} over {self.second}; {spread}; {tests})"
        return f"no winner: {self.best} {_pct(r.value)} over {self.second} is not apart from a tie ({spread}; {tests})"


Setting = tuple[int, int, int, str]  # MTU, hosts, pairs, tunings: what seed 002's summary table holds fixed


def winners_by_setting(data: dict[Setup, Any]) -> dict[Setting, dict[str, Winner | str]]:
    """Seed 002's summary table: per setting and workload category, the topology that moved the most (geometric
    mean over the tests every run of every topology ran; its lead over the runner-up with a 95 % interval over
    runs), or why there is no winner. A :class:`Winner` that is not :attr:`~Winner.decided` names none."""
    out: dict[Setting, dict[str, Winner | str]] = {}
    for setting in sorted({(s.mtu, s.hosts, s.pairs, s.tunings) for s in data}):
        setups = [s for s in data if (s.mtu, s.hosts, s.pairs, s.tunings) == setting]
        runs = [r for s in setups for r in data[s].values()]
        common = set.intersection(*(set(r) for r in runs))
        row: dict[str, Winner | str] = {}
        for name, workloads, metric in CATEGORIES:
            tests = [t for t in common if t.partition("--")[0] in workloads]
            ran = any(t.partition("--")[0] in workloads for r in runs for t in r)
            if len(setups) == 1:
                row[name] = f"only {setups[0].name} measured" if ran else NOT_MEASURED
                continue
            if not tests:
                row[name] = "no test in common" if ran else NOT_MEASURED
                continue
            scores = {s.name: sc for s in setups if (sc := _scores(data[s], tests, metric))}
            ranked = sorted(scores, key=lambda n: -math.fsum(math.log(v) for v in scores[n]) / len(scores[n]))
            lead = ratio(scores[ranked[0]], scores[ranked[1]]) if len(ranked) > 1 else None
            row[name] = (Winner(ranked[0], lead, ranked[1], len(tests)) if lead is not None
                         else "no positive figure to compare")
        out[setting] = row
    return out


def _scores(runs: dict[int, dict[str, dict[str, float]]], tests: Sequence[str], metric: str) -> list[float]:
    """Per run: the geometric mean over ``tests`` (runs with a figure that is not positive left out)."""
    out = []
    for r in runs.values():
        vals = [r[t].get(metric, 0.0) for t in tests]
        if vals and all(v > 0 for v in vals):
            out.append(math.exp(math.fsum(math.log(v) for v in vals) / len(vals)))
    return out


def winners(cells: Sequence[CellRow]) -> list[str]:
    """Seed 002's final table from stored network cells (one tier and accelerator) as text lines: per MTU,
    host count and pairs, which topology moved the most small transactions, large transactions and streaming
    data (transactions/s for request/response, bytes/s for streaming; pairs summed; geometric means)."""
    out = []
    for (mtu, hosts, pairs, tune), row in winners_by_setting(per_run(cells)).items():
        parts = []
        for name, w in row.items():
            parts.append(f"{name}: {w if isinstance(w, str) else w.text()}")
        out.append(f"MTU {mtu}, {hosts} host{'s' if hosts > 1 else ''}, {pairs} pair{'s' if pairs > 1 else ''}"
                   + (f", {tune}" if tune else "") + ": " + "; ".join(parts))
    return out


def macvtap_wins_one_host(data: dict[Setup, Any], tier: str = "") -> NetClaim:
    claim = "on one host macvtap wins small transactions, large transactions and streaming (summary table)"
    seed, figure = "seed:002 p. 57", "macvtap ×3"
    table = {k: v for k, v in winners_by_setting(data).items() if k[1] == 1}
    rows = []
    badges = []
    for (mtu, _hosts, _pairs, _tune), cats in sorted(table.items()):
        ranked = {n: w for n, w in cats.items() if isinstance(w, Winner)}
        if not ranked or not any(s.topology == "macvtap" for s in data if s.mtu == mtu and s.hosts == 1):
            continue
        won = [n for n, w in ranked.items() if w.decided and w.best == "macvtap"]
        lost = [n for n, w in ranked.items() if w.decided and w.best != "macvtap"]
        missing = [n for n in cats if n not in ranked]
        rows.append(f"MTU {mtu}: " + ", ".join(f"{n} → {w.text()}" for n, w in ranked.items())
                    + (f" ({', '.join(missing)} not measured)" if missing else ""))
        badges.append(DOES_NOT_HOLD if lost else HOLDS if len(won) == len(ranked) else INCONCLUSIVE)
    if not rows:
        return NetClaim(seed, claim, figure, None, NOT_MEASURED,
                        f"run bench net{tier} {_topologies(tier, 'macvtap', 'bridge', 'ovs')} --matrix seed-002, one host")
    return NetClaim(seed, claim, figure, "; ".join(rows), _worst(badges))


def net_claims(cells: Sequence[CellRow]) -> list[NetClaim]:
    """Seed 002's measurable claims from one tier's and one accelerator's network cells."""
    data = per_run(cells)
    tiers = {net_tier(c) for c in cells}
    tier = f" --tier {tiers.pop()}" if len(tiers) == 1 else ""
    if any(c.accel == "tcg" and net_tier(c) == "guest" for c in cells):  # the guests' emulation, not the datapath
        why = "measured in TCG guests (software emulation); seed 002 measured KVM guests"
        return [NetClaim(c.seed, c.claim, c.figure, f"{NOT_COMPARABLE} ({why})", NOT_COMPARABLE)
                for c in _claims(data, tier)]
    return _claims(data, tier)


def _claims(data: dict[Setup, Any], tier: str) -> list[NetClaim]:
    return [macvtap_beats_bridges(data, tier), bridge_near_ovs(data, tier), large_mtu_helps(data, 1, tier),
            large_mtu_helps(data, 2, tier), macvtap_wins_one_host(data, tier)]


# --------------------------------------------------------------------------- verify's guest tier as seed evidence

# the rules whose verified fixes answer these claims, by slug (verify stores each cell's rule slug: no table of ids)
VHOST_SLUG = "vhost-disabled"
MULTIQUEUE_SLUG = "net-multiqueue-missing"
CLAIM_VHOST = "vhost-net (the host kernel moves a virtio NIC's packets) beats QEMU's userspace data path in throughput"
CLAIM_MULTIQUEUE = ("virtio-net multiqueue (queues = vCPUs) moves more data over several streams than one queue pair "
                    "(published: +65 % on Linux guests, −47 % on older Windows guests)")


def _verified_claim(cell: CellRow, seed: str, claim: str, figure: str) -> NetClaim:
    """One verified fix as evidence for a claim that the fix helps: under KVM the verify verdict settles it (helps:
    holds; hurts or no measurable effect: does not hold; else inconclusive); under TCG it is not comparable."""
    r = verified_ratio(cell)
    text = f"{verified_subject(cell)}: as fixed {_pct(r.value)}"
    if r.low is not None and r.high is not None:
        text += f" (95 % interval {_pct(r.low)} to {_pct(r.high)}, {r.n} rounds a side)"
    else:
        text += " (no interval)"
    if (cell.config.get("accel") or cell.accel) == "tcg":
        return NetClaim(seed, claim, figure, f"{text}; {NOT_COMPARABLE}: {TCG_NOT_SEED}", NOT_COMPARABLE)
    verdict = str(cell.config.get("verdict") or "")
    badge = {HELPS: HOLDS, HURTS: DOES_NOT_HOLD, NO_EFFECT: DOES_NOT_HOLD}.get(verdict, INCONCLUSIVE)
    return NetClaim(seed, claim, figure, f"{text}; verify: {verdict or '?'}", badge)


def verified_claims(cells: Sequence[CellRow]) -> list[tuple[str, Verdict | NetClaim]]:
    """The seed claims verify's guest tier answers, one per measured fix, each with where it was measured (tier and
    accelerator): seed 000's virtio-blk vs IDE (the bus fix), seed 002's vhost-net, the multiqueue claim."""
    rows: list[tuple[str, Verdict | NetClaim]] = [(verified_where(c), seed000_verified(c))
                                                  for c in verified_cells(cells, VIRTIO_VS_IDE_SLUG)]
    rows += [(verified_where(c), _verified_claim(c, "seed:002", CLAIM_VHOST, "recommended"))
             for c in verified_cells(cells, VHOST_SLUG)]
    rows += [(verified_where(c), _verified_claim(c, "published figures", CLAIM_MULTIQUEUE, "+65 % / −47 %"))
             for c in verified_cells(cells, MULTIQUEUE_SLUG)]
    return rows


def verified_claim_line(claim: Verdict | NetClaim) -> str:
    """One text line of :func:`verified_claims` (the measured text names the run, tier and accelerator)."""
    if isinstance(claim, NetClaim):
        return f"{claim.seed}: {claim.badge}: {claim.measured} (claim: {claim.claim})"
    return claim.line()
