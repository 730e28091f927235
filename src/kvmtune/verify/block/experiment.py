"""Guest disk findings: the disk as it is vs as the fix would make it, on scratch replicas (block tier).

Side B is not guessed: the rule's own fixer edits a copy of the guest's domain
XML (exactly what ``kvmtune fix`` would write), and the edited disk is read back
into the model. Fixes that are not XML edits (format, preallocation) name their
layout change in their rule's :class:`~kvmtune.audit.verifyplan.BlockExperiment` (``layout``, ``by``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kvmtune.audit.rule import all_rules
from kvmtune.audit.verifyplan import BlockExperiment, FioJob
from kvmtune.lab.replica import Layout, Unreplicable
from kvmtune.lab.storage.replay import Replay
from kvmtune.model.guest import Disk, Guest
from kvmtune.verify.block.pair import BlockPair, DiscardProbe, layout_of, scratch_parent
from kvmtune.verify.experiments import Outcome, Subject, Unmeasurable, VerifyContext, replay_fix
from kvmtune.verify.measure import Probe, alternate, judge, settles


def _fixed_disk(guest: Guest, disk: Disk, rule_id: str, ctx: VerifyContext) -> Disk:
    """The disk after ``rule_id``'s fixer ran on a copy of the guest's definition."""
    for d in replay_fix(guest, rule_id, ctx).disks:
        if d.target == disk.target:
            return d
    raise Unmeasurable(f"disk {disk.target} is gone after the fix")


@dataclass
class DiskExperiment:
    subject: Subject
    before: Layout
    after: Layout
    job: FioJob | str
    parent_note: str | None
    assumed: list[str] = field(default_factory=list)
    by: str = "kvmtune fix"
    tier: str = "block"
    nearest_a: str = ""  # side A as it is does not start under QEMU: what was changed to measure from a valid one
    replay: Replay | None = None  # verify --replay: the captured workload of this disk instead of the generic job

    @property
    def change(self) -> str:
        text = self.before.changes_to(self.after)
        return f"{text} (from the nearest valid A: {self.nearest_a})" if self.nearest_a else text

    @property
    def replay_label(self) -> str | None:
        return None if self.replay is None else f"replayed {self.replay.label}"

    @property
    def workload(self) -> str:
        if self.replay is not None:
            return f"replayed {self.replay.label}"
        if isinstance(self.job, str):
            return "write 64 MiB, trim it, host space still allocated"
        return self.job.describe()

    def run(self, ctx: VerifyContext) -> Outcome:
        disk = self.subject.disk
        assert disk is not None
        parent, note = scratch_parent(disk.source if disk.source_type in (None, "file") else None, ctx.workdir)
        notes = [n for n in (note, *self.assumed) if n]
        job = self.job if isinstance(self.job, FioJob) else FioJob("discard", "write")
        size = ctx.size if self.replay is None else self.replay.replica_mib(ctx.size >> 20) << 20
        notes += [] if self.replay is None else self.replay.notes
        with BlockPair(ctx.runner, parent, self.before, self.after, size, job, ctx.seconds, replay=self.replay) as pair:
            probe: Probe = DiscardProbe(pair) if self.job == "discard" else _IopsProbe(pair)
            samples = alternate(probe, ctx.repeat, ctx.deadline, settled=settles(probe.metric, ctx.threshold),
                                until=ctx.finding_until())
        j = judge(samples, probe.metric, ctx.threshold)
        action = f"nothing changed on the guest (scratch replicas, removed); apply with {self.by}"
        details = {
            "before_layout": self.before.describe(), "after_layout": self.after.describe(),
            "samples_a": samples.a, "samples_b": samples.b, "replica_dir": str(parent), "size": ctx.size,
            "workload": self.workload,
        }
        if self.replay is not None:
            details["replay"] = self.replay.record()
        return Outcome(j, action, notes, details, samples.cut_short)


class _IopsProbe:
    def __init__(self, pair: BlockPair) -> None:
        self.pair = pair
        self.metric = pair.metric

    def sample(self, side: str) -> float:
        return self.pair.sample(side)


NO_START_RULE = "disk-io-native-cached"  # the rule that says QEMU refuses io=native without O_DIRECT


def _rule_id(slug: str) -> str:
    """A rule's id from the registry (verify/ names rules by slug, never by a table of ids)."""
    return next((r.id for r in all_rules() if r.slug == slug), slug)


def plan_disk(subject: Subject, ctx: VerifyContext, plan: BlockExperiment) -> DiskExperiment:
    f, guest, disk = subject.finding, subject.guest, subject.disk
    if disk is None:
        raise Unmeasurable("the finding names no disk of an audited guest and no image")
    if disk.source_type not in (None, "file", "block", "volume"):
        raise Unmeasurable(f"a {disk.source_type} disk has no local replica (network storage is not replicated)")
    try:
        before, assumed = layout_of(disk, subject.image)
    except Unreplicable as exc:
        raise Unmeasurable(str(exc)) from None
    if disk.source_type == "block":
        assumed.append("a block device is replicated as a raw file on the work directory's file system")
    by = "kvmtune fix"
    if plan.layout:
        after, by = replace(before, **plan.layout), plan.by  # type: ignore[arg-type]
        if after.format != "qcow2":
            after = replace(after, cluster_size=None)
    elif guest is None:
        raise Unmeasurable("the fix edits a guest's definition, and the finding names no guest")
    else:
        after, _ = layout_of(_fixed_disk(guest, disk, f.rule, ctx), subject.image)
    if after == before:
        raise Unmeasurable("the fix changes nothing the block tier can see")
    nearest_a = ""
    if not before.starts:  # side A cannot be measured: the remaining change, from the nearest layout that starts
        valid = before.nearest_valid()
        nearest_a = before.changes_to(valid)
        rule = _rule_id(NO_START_RULE)
        assumed.insert(0, f"the current setting ({before.describe()}) does not start under QEMU: this confirms "
                          f"{rule}; measured from the nearest valid A ({before.changes_to(valid)})")
        before, after = valid, after.nearest_valid()
        if after == before:
            raise Unmeasurable(f"the current setting does not start under QEMU (this confirms {rule}); from the "
                               "nearest valid A the fix changes nothing the block tier can see")
    source = disk.source if disk.source_type in (None, "file") else None
    _parent, note = scratch_parent(source, ctx.workdir)
    replay = None
    if ctx.replay is not None and plan.job != "discard" and disk.target == ctx.replay_disk:
        replay = ctx.replay  # the workload captured on this disk (matched by target, or --replay-disk)
    return DiskExperiment(subject, before, after, plan.job, note, assumed, by, nearest_a=nearest_a, replay=replay)
