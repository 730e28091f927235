"""Runs the rules over what was read and collects findings and input errors."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kvmtune.audit.context import AuditContext
from kvmtune.audit.finding import Finding
from kvmtune.audit.rule import GuestRule, HostRule, ImageRule, Rule, RunRule, all_rules
from kvmtune.model.guest import Guest


@dataclass
class AuditResult:
    findings: list[Finding] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one line each: "<where>: <problem>"
    looked_at: list[str] = field(default_factory=list)  # what the audit read, for the report header
    guests: list[Guest] = field(default_factory=list)
    images: list[object] = field(default_factory=list)
    host_audited: bool = False


def select_rules(only: Sequence[str] = (), skip: Sequence[str] = ()) -> list[type[Rule]]:
    def match(rule: type[Rule], keys: Sequence[str]) -> bool:
        return any(k.upper() == rule.id or k.lower() == rule.slug or rule.id.startswith(k.upper() + "-") for k in keys)

    rules = list(all_rules())
    if only:
        rules = [r for r in rules if match(r, only)]
    if skip:
        rules = [r for r in rules if not match(r, skip)]
    return rules


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
    audited = [g for g in guests if g.is_kvm_or_qemu]  # other hypervisors' guests: see KVM-GST-001
    for rule_cls in chosen:
        rule = rule_cls()
        if isinstance(rule, GuestRule):
            for guest in guests if rule.any_hypervisor else audited:
                findings.extend(rule.check(guest, ctx))
        elif isinstance(rule, RunRule):
            if audited:
                findings.extend(rule.check_run(audited, ctx))
        elif isinstance(rule, HostRule):
            if audit_host:
                findings.extend(rule.check_host(ctx))
        elif isinstance(rule, ImageRule):
            for image in image_list:
                findings.extend(rule.check_image(image, ctx))
    findings.sort(key=Finding.sort_key)
    return findings
