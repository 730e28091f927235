"""One verify run: every finding → its experiment (or the reason there is none) → one result line.

The budget (``--budget``) is checked before each experiment against its
estimate, and inside it between repeats; what it skipped is listed. Results go
into the results database as a run of kind ``verify`` (one cell per measured
finding), which ``kvmtune report`` shows under "verified fixes".
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvmtune.audit.finding import Finding
from kvmtune.audit.verifyplan import BlockExperiment, GuestExperiment, NoExperiment
from kvmtune.errors import KvmtuneError
from kvmtune.fix.registry import all_fixers
from kvmtune.lab.replica import sweep_leftovers
from kvmtune.lab.runner import Cell, CellSink
from kvmtune.lab.vocabulary import HELPS, HURTS, INCONCLUSIVE, NO_EFFECT, NOT_COMPARABLE
from kvmtune.model.guest import Disk, Guest
from kvmtune.qemu.image import DiskImage
from kvmtune.textsafe import safe
from kvmtune.verify.block.pair import scratch_parent
from kvmtune.verify.experiments import Experiment, LeavesScratch, Subject, Unmeasurable, VerifyContext, seed_figure
from kvmtune.verify.guest.accel import EMULATION
from kvmtune.verify.measure import VERDICTS, OutOfTime
from kvmtune.verify.planner import plan_experiment, plan_for

TIER_LABELS = {
    "block": "block tier: qemu-storage-daemon + fio over NBD on scratch replicas, at host speed (no guest, no TCG)",
    "netns": "namespace tier: netload between two kvmtune network namespaces (veth, 198.18.0.0/15), host kernel only",
    "host": "host tier: the host's own setting, changed through the fix journal and measured with fio",
    "guest": "guest tier: two probe guests booted once a finding (A as it is, B as fixed), the workload run inside "
             "them through their guest agent, under {accel}",
}
GUEST_ACCEL_LABELS = {"kvm": "KVM", "tcg": "TCG (emulation: not evidence for a KVM host; verdicts not comparable)"}
# a guest-tier sample is fio's start in a probe guest (slow under TCG); its start is building the probe guest (cached)
# and booting two of them
SAMPLE_OVERHEAD_S = {"block": 0.35, "netns": 0.3, "host": 0.5, "guest": 1.5}
START_S = {"block": 0.6, "netns": 0.8, "host": 0.5, "guest": 12.0}


@dataclass
class VerifyResult:
    finding: Finding
    tier: str | None = None
    change: str = ""
    workload: str = ""
    replay: str | None = None  # "replayed workload of disk vda (…)" when --replay measured it
    judgement: Any = None  # measure.Judgement
    verdict: str | None = None  # helps | no measurable effect | hurts | inconclusive; None: not measured
    action: str = ""
    reason: str | None = None  # why it was not measured
    error: str | None = None  # the experiment failed: one line
    seed: str | None = None
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    skipped_budget: bool = False
    accel: str | None = None  # the guest tier's accelerator (kvm | tcg); None on the other tiers

    @property
    def target(self) -> str:
        return self.finding.target.label()

    @property
    def measured(self) -> bool:
        return self.judgement is not None

    def line(self) -> str:
        head = f"{self.finding.rule} {self.target}"
        if self.error:
            return f"{head}: {self.change}: measurement failed: {self.error}"
        if self.reason:
            return f"{head}: not measured: {self.reason}"
        assert self.judgement is not None
        text = f"{head}: {self.change}: {self.judgement.describe()}"
        if self.accel == "tcg":
            text += f"; {EMULATION}"
        if self.replay:
            text += f"; {self.replay}"  # verify --replay: measured with the guest's captured workload
        if self.seed:
            text += f"; seed figure: {self.seed}"
        return f"{text}; {self.verdict.upper() if self.verdict else '?'}; {self.action}"

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.finding.rule, "slug": self.finding.slug, "target": self.target,
            "severity": str(self.finding.severity), "tier": self.tier, "change": self.change, "workload": self.workload,
            "replay": self.replay,
            "measurement": self.judgement.to_json() if self.judgement else None, "verdict": self.verdict,
            "action": self.action, "not_measured": self.reason, "error": self.error, "seed": self.seed,
            "notes": self.notes, "details": self.details, "seconds": round(self.seconds, 2),
            "skipped_for_budget": self.skipped_budget, "accel": self.accel,
            "emulation": EMULATION if self.accel == "tcg" else None,
        }


def _has_fix(f: Finding) -> bool:
    if f.rule in all_fixers() or isinstance(plan_for(f.rule), BlockExperiment):
        return True
    # a kernel command line (cmdline) is fixed too: its experiment says it is not measured before a reboot
    return f.fix.kind in ("sysctl", "udev", "image", "sysfs", "cmdline")


def subjects(findings: Sequence[Finding], guests: Sequence[Guest], images: Sequence[DiskImage]) -> list[Subject]:
    """Join every finding to the guest, disk and image it is about."""
    out = []
    for f in findings:
        s = Subject(f)
        t = f.target
        for g in guests:
            if g.name == t.domain and (not f.source or f.source == g.origin or g.origin in f.source):
                s.guest = g
                break
        if s.guest is not None and t.device and t.device.startswith("disk:"):
            ev = f.evidence
            by_place = [d for d in s.guest.disks if d.locator and (ev == d.locator or ev.startswith(d.locator + "/"))]
            by_name = [d for d in s.guest.disks if d.label == t.device]
            found = by_place or by_name
            s.disk = found[0] if found else None
        if s.guest is not None and t.device and t.device.startswith("net:"):
            ev = f.evidence
            nics = [n for n in s.guest.nics if n.locator and (ev == n.locator or ev.startswith(n.locator + "/"))]
            s.interface = next(iter(nics or [n for n in s.guest.nics if n.label == t.device]), None)
        if t.device and t.device.startswith("image:"):
            s.image, s.disk = _image_disk(t.device[len("image:"):], images)
        elif s.disk is not None:
            for img in images:
                if any(u.domain == s.guest.name and u.disk == s.disk.target for u in img.used_by):  # type: ignore[union-attr]
                    s.image = img
                    break
        out.append(s)
    return out


def _image_disk(path: str, images: Sequence[DiskImage]) -> tuple[DiskImage | None, Disk | None]:
    """An image given with --images as the disk its first user sees (its cache mode), or as QEMU's default."""
    for img in images:
        if img.path == path:
            use = img.used_by[0] if img.used_by else None
            kind = "block" if img.is_block_device else "file"
            return img, Disk(target=os.path.basename(path), format=img.format, cache=use.cache if use else None,
                             source=img.path, source_type=kind)
    return None, None


def estimate(exp: Experiment, ctx: VerifyContext) -> float:
    per = ctx.seconds + SAMPLE_OVERHEAD_S.get(exp.tier, 0.5)
    return START_S.get(exp.tier, 0.5) + 2 * ctx.repeat * per


@dataclass
class Planned:
    result: VerifyResult
    subject: Subject
    experiment: Experiment | None


def plan_all(subs: Sequence[Subject], ctx: VerifyContext) -> list[Planned]:
    """Every finding with its experiment, or with the reason it has none."""
    out = []
    for s in subs:
        f = s.finding
        r = VerifyResult(f, seed=seed_figure(f.rule))
        exp: Experiment | None = None
        if not _has_fix(f) and not isinstance(plan_for(f.rule), NoExperiment):
            r.reason = "no automatic fix to verify ('kvmtune audit' explains it)"
        else:
            try:
                exp = plan_experiment(s, ctx)
            except Unmeasurable as exc:
                r.reason = str(exc)
            except KvmtuneError as exc:
                r.reason = f"cannot plan the experiment: {exc}"
        if exp is not None:
            r.tier, r.change, r.workload = exp.tier, exp.change, exp.workload
            r.replay = getattr(exp, "replay_label", None)
        out.append(Planned(r, s, exp))
    return out


def sweep(planned: Sequence[Planned], ctx: VerifyContext) -> None:
    """Remove what a killed verify left in the places this run uses."""
    parents = {ctx.workdir}
    for p in planned:
        disk = p.subject.disk
        if disk is not None:
            parents.add(scratch_parent(disk.source, ctx.workdir)[0])
        if isinstance(p.experiment, LeavesScratch):  # a host experiment's scratch on the device's mount point
            parents.update(p.experiment.scratch_parents(ctx))
    for gone in sweep_leftovers(parents):
        ctx.notes.append(f"removed {gone}, left by a verify run that was killed")


def guest_sees_it(subject: Subject) -> str:
    """For a fix of a running guest's definition: when the guest itself sees it (fix/effect.py's rule)."""
    guest = subject.guest
    if guest is None or subject.finding.fix.kind != "xml" or guest.active is not True:
        return ""
    return "; the running guest sees it only after its restart (kvmtune fix: takes effect restart)"


def execute_one(p: Planned, ctx: VerifyContext) -> None:
    """Run ``p``'s experiment (if it fits the budget) and fill in its result."""
    r, exp = p.result, p.experiment
    if exp is None:
        return
    need = estimate(exp, ctx)
    if ctx.deadline is not None and time.monotonic() + need > ctx.deadline:
        r.reason = f"skipped: --budget left too little time (needs about {need:.0f}s)"
        r.skipped_budget = True
        return
    start = time.monotonic()
    try:
        out = exp.run(ctx)
    except Unmeasurable as exc:
        r.reason = str(exc)
        return
    except OutOfTime:
        r.reason = "skipped: --budget ran out"
        r.skipped_budget = True
        return
    except KvmtuneError as exc:
        r.error = str(exc)
        return
    finally:
        r.seconds = time.monotonic() - start
    r.judgement, r.verdict, r.action = out.judgement, out.judgement.verdict if out.judgement else None, out.action
    r.action += guest_sees_it(p.subject)
    r.notes.extend(out.notes)
    accel = out.details.get("accel")
    r.accel = accel if isinstance(accel, str) else None
    plan = plan_for(r.finding.rule)
    if isinstance(plan, (BlockExperiment, GuestExperiment)) and plan.note:
        r.notes.append(plan.note)
    r.details = out.details
    if out.cut_short:
        r.notes.append(f"--budget: {out.judgement.n if out.judgement else 0} of {ctx.repeat} repeats")


def run_verify(
    subs: Sequence[Subject], ctx: VerifyContext, progress: Callable[[VerifyResult], None] | None = None
) -> list[VerifyResult]:
    """Plan and run everything in-process (no results database)."""
    planned = plan_all(subs, ctx)
    sweep(planned, ctx)
    for p in planned:
        execute_one(p, ctx)
        if progress is not None and p.experiment is not None:
            progress(p.result)
    return [p.result for p in planned]


def to_cell(r: VerifyResult) -> Cell:
    """The stored form of one measured (or failed) finding."""
    j = r.judgement
    metrics: dict[str, float] = {}
    if j is not None:
        metrics = {"before": j.before, "after": j.after, "n": float(j.n)}
        if j.ratio is not None:
            metrics["ratio"] = j.ratio
        if j.interval is not None:
            metrics["ratio_ci_low"], metrics["ratio_ci_high"] = j.interval
    # the slug lets the report find the seed claims a fix answers (bench/ names rules by slug, never by id)
    config = {"rule": r.finding.rule, "slug": r.finding.slug, "target": r.target, "change": r.change, "tier": r.tier,
              "verdict": r.verdict, "action": r.action, "metric": j.metric.name if j else None,
              "unit": j.metric.unit if j else None, "higher_is_better": j.metric.higher_is_better if j else None,
              "seed": r.seed, "accel": r.accel}
    return Cell(f"{r.finding.rule}|{r.target}", config, r.workload or "-", "ok" if j is not None else "error", metrics,
                error=r.error or r.reason, raw=json.dumps(r.to_json(), default=str), duration_s=r.seconds)


@dataclass
class VerifyBenchmark:
    """The verify run as a :class:`~kvmtune.lab.runner.Benchmark`: the shared runner owns the run row,
    SIGTERM and the cleanup call; each measured finding becomes one cell."""

    planned: list[Planned]
    ctx: VerifyContext
    env: dict[str, Any]
    kind: str = "verify"
    started: int = 0  # planned findings whose experiment has run (or was skipped): the ETA counts the rest

    def plan(self) -> str:
        n = self.planned_cells()
        return f"verify: {n} experiment(s) for {len(self.planned)} finding(s)"

    def planned_cells(self) -> int:
        return sum(1 for p in self.planned if p.experiment is not None)

    def environment(self) -> dict[str, Any]:
        return self.env

    def execute(self, sink: CellSink) -> None:
        sweep(self.planned, self.ctx)
        for i, p in enumerate(self.planned):
            if p.experiment is None:
                continue
            execute_one(p, self.ctx)
            self.started = i + 1
            if not p.result.skipped_budget:
                sink.record(to_cell(p.result))

    def remaining_seconds(self) -> float:
        """The ETA: each experiment still to run by its tier's :func:`estimate` (a guest-tier finding boots two probe
        guests: tens of seconds where a block-tier one takes seconds), never past ``--budget``'s end."""
        left = sum(estimate(p.experiment, self.ctx) for p in self.planned[self.started:] if p.experiment is not None)
        if self.ctx.deadline is not None:
            left = min(left, max(0.0, self.ctx.deadline - time.monotonic()))
        return left

    def describe(self, cell: Cell) -> str:
        cfg = cell.config
        return f"{cfg.get('verdict')} (ratio {cell.metrics.get('ratio', float('nan')):.2f})"

    def cleanup(self) -> list[str]:
        return []  # every experiment cleans up after itself (context managers, journal undo)

    @property
    def results(self) -> list[VerifyResult]:
        return [p.result for p in self.planned]


def render_text(results: Sequence[VerifyResult], ctx: VerifyContext, elapsed: float) -> str:
    out: list[str] = []
    tiers = sorted({r.tier for r in results if r.tier and r.measured})
    for t in tiers:
        label = TIER_LABELS.get(t, t)
        if t == "guest":
            accels = sorted({r.accel for r in results if r.tier == t and r.measured and r.accel})
            label = label.format(accel=", ".join(GUEST_ACCEL_LABELS.get(a, a) for a in accels) or "?")
        out.append(f"# {label}")
    out.append(f"# each side at least {ctx.repeat}× alternating A (as it is) / B (as fixed), {ctx.seconds:g}s each, then "
               f"more rounds until the verdict settles (at most {ctx.finding_budget:g}s a finding); ratio B/A with its 95% "
               f"interval; helps/hurts only when the whole interval lies beyond ±{ctx.threshold:g}%, no measurable effect "
               "only when it lies wholly inside, else inconclusive (docs/verdicts.md)")
    if "host" in tiers:
        out.append("# host tier: the sides are measured in two blocks (before, after the change), not alternated")
    measured = [r for r in results if r.measured or r.error]
    rest = [r for r in results if not (r.measured or r.error)]
    # a line names a domain (from its XML or libvirt), a disk, an error's text: each escaped as one line (textsafe)
    for r in measured:
        out.append(safe(r.line()))
        out.extend(f"    note: {safe(n)}" for n in dict.fromkeys(r.notes))
    if rest:
        out.append("")
        out.append("Not measured:")
        out.extend("  " + safe(r.line()) for r in rest)
    out.extend(f"note: {safe(n)}" for n in ctx.notes)
    counts = {v: sum(1 for r in results if r.verdict == v) for v in VERDICTS}
    skipped = sum(1 for r in results if r.skipped_budget)
    summary = (f"{len(measured)} of {len(results)} finding(s) measured in {elapsed:.0f}s: {counts[HELPS]} help, "
               f"{counts[NO_EFFECT]} no measurable effect, {counts[HURTS]} hurt, {counts[INCONCLUSIVE]} inconclusive")
    not_comparable = sum(1 for r in results if r.verdict == NOT_COMPARABLE)
    if not_comparable:
        summary += f", {not_comparable} not comparable (emulation)"
    if skipped:
        summary += f"; {skipped} skipped for --budget"
    out.append(summary)
    return "\n".join(out) + "\n"
