"""Runs the rules over what was read and collects findings and input errors."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvmtune.audit.context import AuditContext
from kvmtune.audit.finding import Finding
from kvmtune.audit.rule import GuestRule, HostRule, ImageRule, Rule, RunRule, all_rules
from kvmtune.errors import UsageError
from kvmtune.model.guest import Guest
from kvmtune.qemu.image import DiskImage


@dataclass
class AuditResult:
    findings: list[Finding] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one line each: "<where>: <problem>"
    looked_at: list[str] = field(default_factory=list)  # what the audit read, for the report header
    guests: list[Guest] = field(default_factory=list)
    images: list[DiskImage] = field(default_factory=list)
    host_audited: bool = False
    hints: list[str] = field(default_factory=list)  # what to try next, for people (never in JSON/SARIF)
    host: str = ""  # the audited host's label (hostname, or a captured tree's name): fleet reports key on it
    waiver_notes: list[str] = field(default_factory=list)  # one line per expired or stale waiver (audit/waivers.py)
    baseline: str | None = None  # audit --new-since FILE: findings carry .new
    resolved: list[dict[str, Any]] = field(default_factory=list)  # the baseline's findings this run no longer has
    show_waived: bool = False  # text: waived findings in full, not one line each
    scope: list[str] = field(default_factory=list)  # what was asked for: "host", "guests" (fleet: like with like)
    # audit --staged: the journaled fixes not in force yet (fix/status.summary), which the fleet report counts
    staged: dict[str, Any] | None = None


def rule_matches(rule: type[Rule], key: str) -> bool:
    """An id (KVM-STO-002), an id prefix (KVM-STO, KVM-STO-00), a slug or a slug prefix (disk-cache)."""
    upper, lower = key.upper(), key.lower()
    return rule.id.startswith(upper) or rule.slug.startswith(lower)


def select_rules(only: Sequence[str] = (), skip: Sequence[str] = ()) -> list[type[Rule]]:
    """The rules ``--only``/``--skip`` leave. A key that matches no rule is a usage error (a typo
    in a CI gate would otherwise select nothing and pass)."""
    rules = list(all_rules())
    for option, keys in (("--only", only), ("--skip", skip)):
        for key in keys:
            if not any(rule_matches(r, key) for r in rules):
                raise UsageError(f"{option} {key}: no rule id, slug or prefix matches{_did_you_mean(key, rules)}")
    if only:
        rules = [r for r in rules if any(rule_matches(r, k) for k in only)]
    if skip:
        rules = [r for r in rules if not any(rule_matches(r, k) for k in skip)]
    return rules


def _did_you_mean(key: str, rules: Sequence[type[Rule]]) -> str:
    import difflib

    names = [r.id for r in rules] + [r.slug for r in rules] + sorted({r.id[:7] for r in rules})
    close = difflib.get_close_matches(key.upper() if key[:4].upper() == "KVM-" else key.lower(), names, n=3, cutoff=0.5)
    if not close:  # nothing near: the groups, which are valid prefixes
        close = sorted({r.id[:7] for r in rules})
    return f"; did you mean {', '.join(close)}? ('kvmtune rules list' shows them all)"


def guarded(rule: Rule, subject: object, check: Callable[..., Iterable[Finding]], ctx: AuditContext,
            out: list[Finding], *args: object) -> None:
    """Run one rule on one subject (``check(*args)``); a rule that raises costs one error line, not the audit.

    Findings it yielded before it raised are kept: they were evaluated. ``subject`` (a guest, an
    image or a text) is named only when the rule raises.
    """
    try:
        for finding in check(*args):
            out.append(finding)
    except Exception as exc:
        ctx.errors.append(_failed(rule, subject, exc))


def guarded_each(rule: Rule, check: Callable[[Any, AuditContext], Iterable[Finding]], subjects: Iterable[Any],
                 ctx: AuditContext, out: list[Finding]) -> None:
    """:func:`guarded` for one rule over many subjects (``check(subject, ctx)`` each), same contract.

    The guest rules run here ~34,000 times over the corpus: one loop per rule, no call per
    subject besides the rule's own, is a fifth of the rule pass. The inner loop, not
    ``out.extend(check(...))``: extend asks a generator for a length hint it has not, grows the
    list by eight slots and shrinks it back, for every call (a fifth more instructions per call
    of a rule that finds nothing, which is most calls). Findings yielded before a rule raised are kept.
    """
    append = out.append
    for subject in subjects:
        try:
            for finding in check(subject, ctx):
                append(finding)
        except Exception as exc:
            ctx.errors.append(_failed(rule, subject, exc))


def _failed(rule: Rule, subject: object, exc: Exception) -> str:
    """The one error line of a rule that raised (built only then: the loops above stay lean)."""
    return f"{rule.id}: could not be evaluated{_subject(subject)} ({type(exc).__name__}: {exc})"


def _subject(subject: object) -> str:
    if isinstance(subject, Guest):
        return f" for guest {subject.name}"
    if isinstance(subject, DiskImage):
        return f" for {subject.path}"
    return str(subject)


def run_rules(
    ctx: AuditContext,
    guests: Sequence[Guest] = (),
    images: Iterable[DiskImage] = (),
    audit_host: bool = False,
    rules: Sequence[type[Rule]] | None = None,
) -> list[Finding]:
    chosen = list(rules) if rules is not None else list(all_rules())
    findings: list[Finding] = []
    ctx.images = list(images)
    audited = [g for g in guests if g.is_kvm_or_qemu]  # other hypervisors' guests: see KVM-GST-001
    with_devices: dict[tuple[bool, str], list[Guest]] = {}  # (any hypervisor, device list) -> those guests
    for rule_cls in chosen:
        rule = rule_cls()
        if isinstance(rule, GuestRule):
            subjects = guests if rule.any_hypervisor else audited
            if rule.judges_only is not None:
                key = (rule.any_hypervisor, rule.judges_only)
                if key not in with_devices:
                    with_devices[key] = [g for g in subjects if getattr(g, rule.judges_only)]
                subjects = with_devices[key]
            if rule.rests_on_absence:
                subjects = [g for g in subjects if not g.unread]
            guarded_each(rule, rule.check, subjects, ctx, findings)
        elif isinstance(rule, RunRule):
            if audited:
                guarded(rule, "", rule.check_run, ctx, findings, audited, ctx)
        elif isinstance(rule, HostRule):
            if audit_host:
                guarded(rule, "", rule.check_host, ctx, findings, ctx)
        elif isinstance(rule, ImageRule):
            guarded_each(rule, rule.check_image, ctx.images, ctx, findings)
    findings.sort(key=Finding.sort_key)
    return findings
