"""Rule base classes and discovery (one rule = one file + a sibling .md doc)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Iterable
from functools import cache, cached_property
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from kvmtune.audit.finding import TOPICS, Finding, FixHint, FixKind, Severity, Target
from kvmtune.audit.verifyplan import VerifyPlan
from kvmtune.kubevirt.form import KubevirtForm
from kvmtune.proxmox.qmset import PveForm

if TYPE_CHECKING:
    from kvmtune.audit.context import AuditContext
    from kvmtune.model.guest import Guest
    from kvmtune.qemu.image import DiskImage


class Rule:
    """Common metadata. Subclasses pick a scope by subclassing one of the four below."""

    id: ClassVar[str] = ""
    slug: ClassVar[str] = ""
    topic: ClassVar[str] = ""
    severity: ClassVar[Severity] = Severity.MEDIUM
    also_severities: ClassVar[tuple[Severity, ...]] = ()  # a finding may be raised or lowered to these
    title: ClassVar[str] = ""
    why: ClassVar[str] = ""
    fix_kind: ClassVar[FixKind] = "manual"
    fix_description: ClassVar[str] = ""
    fix_safe: ClassVar[bool] = False
    references: ClassVar[tuple[str, ...]] = ()
    # what `kvmtune verify` measures for the fix, or why nothing (audit/verifyplan.py); every rule
    # whose fix_kind is not manual sets it (tests/verify/test_verify_plans.py)
    verify: ClassVar[VerifyPlan | None] = None
    # the fix in Proxmox VE's terms (a qm set change, proxmox/qmset.py), where the fix is a config change
    pve: ClassVar[PveForm | None] = None
    # the fix in KubeVirt's terms (the VirtualMachine field, kubevirt/form.py); None: no form declared
    kubevirt: ClassVar[KubevirtForm | None] = None
    scope: ClassVar[str] = ""
    # guest rules see only KVM/QEMU guests unless they say they judge any hypervisor's
    any_hypervisor: ClassVar[bool] = False

    @classmethod
    def severity_label(cls) -> str:
        """``low`` or, for a rule whose findings can differ, the span ``low–medium``."""
        span = sorted({cls.severity, *cls.also_severities})
        return str(span[0]) if len(span) == 1 else f"{span[0]}–{span[-1]}"

    @classmethod
    def doc_path(cls) -> Path:
        return Path(inspect.getfile(cls)).with_suffix(".md")

    @classmethod
    def doc(cls) -> str:
        return cls.doc_path().read_text(encoding="utf-8")

    def finding(
        self,
        *,
        target: Target,
        actual: str,
        expected: str,
        evidence: str,
        summary: str | None = None,
        why: str | None = None,
        severity: Severity | None = None,
        confidence: str = "certain",
        source: str = "",
        fix_description: str | None = None,
        fix_safe: bool | None = None,
        fix_kind: FixKind | None = None,
    ) -> Finding:
        if fix_kind is None and fix_description is None and fix_safe is None:
            fix = self.fix_hint
        else:
            fix = FixHint(
                kind=fix_kind or self.fix_kind,
                description=fix_description or self.fix_description,
                safe=self.fix_safe if fix_safe is None else fix_safe,
            )
        # positional, in Finding's field order: keywords cost a third of building a finding, and
        # the corpus audit builds ~6,000 of them
        return Finding(
            self.id, self.slug, self.topic, self.severity if severity is None else severity, confidence, target,
            actual, expected, evidence, summary or self.title, why or self.why, fix, self.references, source,
        )

    @cached_property
    def fix_hint(self) -> FixHint:
        """The rule's own fix advice, one object shared by its findings that do not change it."""
        return FixHint(kind=self.fix_kind, description=self.fix_description, safe=self.fix_safe)


# the parts of a Guest a rule may declare it judges exclusively (GuestRule.judges_only): a device list,
# its VFIO devices (``hostdevs``), its vCPU pinning (``vcpu_pinned``), what its guest agent answered
# (``inside``), or its running on the audited host (``on_audited_host``)
DeviceList = Literal["disks", "nics", "rngs", "hostdevs", "vcpu_pinned", "inside", "on_audited_host"]


class GuestRule(Rule):
    """Checks one guest (from domain XML, libvirt or a QEMU command line)."""

    scope = "guest"
    # A rule that only ever reports about a guest's disks (NICs, RNGs) says so here: a guest without
    # any is then not passed to ``check`` at all. Most corpus guests have no disk and no NIC, so this
    # halves the calls of the device rules (tests/audit/test_judges_only.py holds each to its word).
    # Likewise ``hostdevs``, ``vcpu_pinned``, ``inside`` (rules on what the guest agent answered: a guest
    # read from a file has no answers) and ``on_audited_host`` (host-relative rules: a file's guest runs
    # on some other host).
    judges_only: ClassVar[DeviceList | None] = None
    # A rule whose finding is an absence ("no RNG device") says so here: a guest with a part not read
    # (``Guest.unread``, a -readconfig file) may hold what is absent, so it is not passed to ``check``.
    rests_on_absence: ClassVar[bool] = False

    def check(self, guest: Guest, ctx: AuditContext) -> Iterable[Finding]:
        raise NotImplementedError

    @staticmethod
    def target(guest: Guest, device: str | None = None) -> Target:
        return Target("localhost", guest.name, device)  # positional: one per finding, keywords cost more


class RunRule(Rule):
    """Checks everything audited in one run together (e.g. duplicate MACs)."""

    scope = "run"

    def check_run(self, guests: list[Guest], ctx: AuditContext) -> Iterable[Finding]:
        raise NotImplementedError


class HostRule(Rule):
    """Checks the host through ``ctx.facts`` (:class:`~kvmtune.host.facts.HostFacts`)."""

    scope = "host"

    def check_host(self, ctx: AuditContext) -> Iterable[Finding]:
        raise NotImplementedError


class ImageRule(Rule):
    """Checks one disk image (:class:`~kvmtune.qemu.image.DiskImage`); ``ctx.images`` holds the whole run's."""

    scope = "image"

    def check_image(self, image: DiskImage, ctx: AuditContext) -> Iterable[Finding]:
        raise NotImplementedError


SCOPES = (GuestRule, RunRule, HostRule, ImageRule)


@cache
def all_rules() -> tuple[type[Rule], ...]:
    """Import every module below ``kvmtune.rules`` and return the rule classes, by id."""
    import kvmtune.rules as pkg

    found: dict[str, type[Rule]] = {}
    for info in pkgutil.walk_packages(pkg.__path__, prefix="kvmtune.rules."):
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if (
                inspect.isclass(obj)
                and issubclass(obj, Rule)
                and obj not in SCOPES
                and obj is not Rule
                and obj.id
                and obj.__module__ == module.__name__
            ):
                if obj.id in found:
                    raise RuntimeError(f"duplicate rule id {obj.id}: {found[obj.id]} and {obj}")
                if obj.topic not in TOPICS:
                    raise RuntimeError(f"rule {obj.id} has unknown topic {obj.topic!r}")
                found[obj.id] = obj
    return tuple(found[k] for k in sorted(found))


def rule_by_id(rule_id: str) -> type[Rule] | None:
    key = rule_id.strip().upper()
    for r in all_rules():
        if r.id == key or r.slug == rule_id.strip().lower():
            return r
    return None
