"""What an experiment is and what it works with: the context of a verify run, its subjects and outcomes.

Which experiment measures a rule's fix is the rule's own declaration, its ``verify``
attribute (plain data from :mod:`kvmtune.audit.verifyplan`, in the rule's file);
:mod:`kvmtune.verify.planner` turns it into an experiment: a guest disk's fio job
on the block tier (:mod:`kvmtune.verify.block.experiment`), the runtime value the host fix
writes (:mod:`kvmtune.verify.host.experiment`: a namespace experiment, or a host-wide one
only with ``--apply``), or the rule's one-line reason, so nothing is silently left out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from kvmtune.audit.finding import Finding
from kvmtune.fix.registry import FixOptions
from kvmtune.host.root import HostRoot
from kvmtune.lab.accel import AccelChoice
from kvmtune.lab.storage.replay import Replay
from kvmtune.model.guest import Disk, Guest, Nic
from kvmtune.qemu.image import DiskImage
from kvmtune.runner import Runner
from kvmtune.verify.measure import Judgement


class Unmeasurable(Exception):
    """This finding's fix cannot be measured here; ``str()`` is the one-line reason."""


@dataclass
class VerifyContext:
    runner: Runner
    host: HostRoot
    root: str
    workdir: Path
    size: int = 1 << 30
    seconds: float = 1.0  # one sample's measuring time
    repeat: int = 3  # rounds a side at least
    finding_budget: float = 30.0  # seconds one finding may go on measuring (sequential rounds) until its verdict settles
    threshold: float = 5.0
    deadline: float | None = None  # time.monotonic() by which the run must end
    apply: bool = False
    keep: bool = False
    journal_dir: Path | None = None
    profile: str = "virtual-host"
    notes: list[str] = field(default_factory=list)
    # the guest tier (lab/probe/pair.py): measure under TCG emulation too (--allow-tcg), the accelerator the probe
    # guests get (decided once a run: verify/guest/accel.pair_accel), another kernel for them, and the inputs of this
    # run as options (for the command a "needs KVM" line names)
    allow_tcg: bool = False
    guest_accel: AccelChoice | None = None
    guest_kernel: str | None = None
    guest_modules: str | None = None
    inputs_hint: str = ""
    # --replay FILE: a captured workload measures the block-tier findings of the definition's disk ``replay_disk``
    replay: Replay | None = None
    replay_disk: str | None = None

    def finding_until(self) -> float:
        """When the finding now starting must stop adding rounds (its cap, or the run's budget if sooner)."""
        until = time.monotonic() + self.finding_budget
        return until if self.deadline is None else min(until, self.deadline)


@dataclass
class Subject:
    """One finding and the objects it is about."""

    finding: Finding
    guest: Guest | None = None
    disk: Disk | None = None
    image: DiskImage | None = None
    interface: Nic | None = None  # a NIC finding's interface (the guest tier's NIC experiments)


@dataclass
class Outcome:
    judgement: Judgement | None
    action: str  # what was kept or undone, or "nothing changed (scratch replicas)"
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    cut_short: bool = False


class Experiment(Protocol):
    @property
    def tier(self) -> str: ...  # block | netns | host | guest

    @property
    def change(self) -> str: ...  # the change the fix makes, one line

    @property
    def workload(self) -> str: ...  # what is measured, one line

    def run(self, ctx: VerifyContext) -> Outcome: ...


@runtime_checkable
class LeavesScratch(Protocol):
    """An experiment whose scratch directory may sit outside the work directory and the disks' own
    directories (a host experiment measures on the device's mount point): where a killed run left it."""

    def scratch_parents(self, ctx: VerifyContext) -> list[Path]: ...


def replay_fix(guest: Guest, rule_id: str, ctx: VerifyContext, options: FixOptions | None = None) -> Guest:
    """The guest after ``rule_id``'s own fixer ran on a copy of its definition (exactly what ``kvmtune fix`` would
    write, read back into the model): side B of every experiment that replays a fix. ``options``: what the copy may
    get (a guest-visible change is allowed on it); default, what ``kvmtune fix`` writes unasked."""
    from lxml import etree

    from kvmtune.audit.rule import all_rules
    from kvmtune.domain.xml import guest_from_tree, parse_xml_bytes
    from kvmtune.errors import KvmtuneError
    from kvmtune.fix.domains import fix_guest

    if guest.tree is None:
        raise Unmeasurable("the guest was not read from domain XML, so the fix cannot be replayed on a copy")
    rules = [r for r in all_rules() if r.id == rule_id]
    try:
        _g, result = fix_guest(etree.tostring(guest.tree), guest.origin, guest.origin_kind, rules,
                               options or FixOptions(host=ctx.host))
    except KvmtuneError as exc:
        raise Unmeasurable(f"the fix cannot be replayed: {exc}") from None
    if result.after is None:
        why = "; ".join(result.skipped) or "the fixer changed nothing"
        raise Unmeasurable(f"the fix makes no change here ({why})")
    return guest_from_tree(parse_xml_bytes(result.after, guest.origin), guest.origin, guest.origin_kind)


def seed_figure(rule_id: str) -> str | None:
    """The seed's claim for this rule (its first ``seed:NNN (...)`` reference), if it has one."""
    from kvmtune.audit.rule import all_rules

    for rule in all_rules():
        if rule.id == rule_id:
            for ref in rule.references:
                if ref.startswith("seed:"):
                    return ref
    return None
