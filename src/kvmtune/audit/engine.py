"""Runs the rules over what was read and collects findings and input errors."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kvmtune.audit.context import AuditContext
from kvmtune.audit.finding import Finding
from kvmtune.audit.rule import GuestRule, HostRule, ImageRule, Rule, RunRule, all_rules
from kvmtune.errors import UsageError
from kvmtune.model.guest import Guest


@dataclass
class AuditResult:
    findings: list[Finding] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one line each: "<where>: <problem>"
    looked_at: list[str] = field(default_factory=list)  # what the audit read, for the report header
    guests: list[Guest] = field(default_factory=list)
    images: list[object] = field(default_factory=list)
    host_audited: bool = False
    hints: list[str] = field(default_factory=list)  # what to try next, for people (never in JSON/SARIF)


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
    return f"; did you mean {', '.join(close)}?" if close else "; 'kvmtune rules list' shows them"


def run_rules(
    ctx: AuditContext,
    guests: Sequence[Guest] = (),
    images: Iterable[object] = (),
    audit_host: bool = False,
    rules: Sequence[type[Rule]] | None = None,
) -> list[Finding]:
    chosen = list(rules) if rules is not None else list(all_rules())
    findings: list[Finding] = []
    image_list = list(images)
    for rule_cls in chosen:
        rule = rule_cls()
        if isinstance(rule, GuestRule):
            for guest in guests:
                findings.extend(rule.check(guest, ctx))
        elif isinstance(rule, RunRule):
            if guests:
                findings.extend(rule.check_run(list(guests), ctx))
        elif isinstance(rule, HostRule):
            if audit_host:
                findings.extend(rule.check_host(ctx))
        elif isinstance(rule, ImageRule):
            for image in image_list:
                findings.extend(rule.check_image(image, ctx))
    findings.sort(key=Finding.sort_key)
    return findings
