"""Planning fixes for domain definitions: XML files and libvirt domains.

For one guest: audit it, call the fixer of every finding that has one, audit the
edited tree again (a fix can reveal the next finding: ``cache`` unset → ``none``
then asks for ``io``) until nothing new turns up, and check that every finding a
fixer handled is gone. The result is one change per guest with the whole diff.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from lxml import etree

from kvmtune.audit.collect import is_local_uri
from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.audit.finding import Finding, Waiver
from kvmtune.audit.rule import GuestRule, Rule
from kvmtune.audit.waivers import guest_waivers, live_waiver
from kvmtune.domain.xml import MAX_XML_BYTES, guest_from_tree, parse_xml_bytes
from kvmtune.errors import InputError
from kvmtune.fix.diff import Reason
from kvmtune.fix.effect import Planned
from kvmtune.fix.encoding import utf16_of
from kvmtune.fix.files import read_state_and_dir
from kvmtune.fix.live import LiveSet, live_changes
from kvmtune.fix.plan import Change, Plan, XmlEdit, XmlFileEdit
from kvmtune.fix.registry import FixCall, FixOptions, NotFixable, XmlFixer, all_fixers
from kvmtune.fix.xmldoc import XmlDoc
from kvmtune.model.guest import Guest

MAX_ROUNDS = 5


@dataclass
class GuestFix:
    after: bytes | None = None
    reasons: list[Reason] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    manual: list[Finding] = field(default_factory=list)
    fixed: list[tuple[XmlFixer, Finding, str]] = field(default_factory=list)  # fixer, finding, what it said

    def planned(self, guest: str, *, origin: str, active: bool, live: frozenset[str] = frozenset()) -> list[Planned]:
        """Each fix with when it takes effect, as its fixer declares it for this guest's state (``live``: the rules
        whose change ``fix --live`` also makes on the running domain)."""
        return [Planned(guest, f.rule, f.target.device or guest, what,
                        fixer.takes_effect(origin=origin, active=active, live=f.rule in live))
                for fixer, f, what in self.fixed]


def _key(f: Finding) -> tuple[str, str, str]:
    # ``actual`` is part of the key: a finding that changed after a fix (KVM-STO-011 now naming the
    # disk another fixer just moved to virtio) is a new finding to handle, not one already tried.
    return (f.rule, f.evidence, f.actual)


def _read(tree: etree._ElementTree, where: str, origin_kind: str, on_host: bool) -> Guest:
    """A definition is fixed in the scope ``audit`` would judge it in: the host-relative rules (vCPUs against
    this host's CPUs) apply to a local libvirt's domains, and to files only with ``--assume-this-host``."""
    guest = guest_from_tree(tree, where, origin_kind)
    guest.on_audited_host = on_host
    return guest


def fix_guest(
    data: bytes, where: str, origin_kind: str, rules: Sequence[type[Rule]], options: FixOptions
) -> tuple[Guest, GuestFix]:
    """Fix the guest whose definition is ``data``; nothing is written here.

    A fixer whose change does not remove its finding loses only its own change: the guest is
    planned again without that fixer, and the plan says so."""
    dropped: dict[str, str] = {}
    while True:
        guest, result, left = _fix_guest_once(data, where, origin_kind, rules, options, dropped)
        if not left:
            return guest, result
        for rule_id in left:
            dropped[rule_id] = "its change did not remove the finding (a kvmtune bug); left out, the rest goes ahead"


def _fix_guest_once(
    data: bytes,
    where: str,
    origin_kind: str,
    rules: Sequence[type[Rule]],
    options: FixOptions,
    dropped: dict[str, str],
) -> tuple[Guest, GuestFix, set[str]]:
    fixers = all_fixers()
    guest_rules = [r for r in rules if issubclass(r, GuestRule)]
    ctx = AuditContext(host=options.host)
    on_host = options.assume_this_host or (origin_kind == "libvirt" and is_local_uri(where.split("#", 1)[0]))
    guest = _read(parse_xml_bytes(data, where), where, origin_kind, on_host)
    name = guest.name
    doc = XmlDoc(data, guest.tree, where)
    result = GuestFix()
    attempted: set[tuple[str, str, str]] = set()
    fixed: set[tuple[str, str, str]] = set()
    current = guest
    settled: list[Finding] | None = None  # the findings of the edited tree, once a round turns up nothing new
    guessed: set[str] = set()  # rules left alone because the guest's identity is only guessed (not named)
    for _round in range(MAX_ROUNDS):
        everything = run_rules(ctx, [current], rules=guest_rules)
        findings = [f for f in everything if _key(f) not in attempted]
        if not findings:
            settled = everything
            break
        for f in findings:
            attempted.add(_key(f))
            fixer = fixers.get(f.rule)
            label = f"{f.rule} {f.target.device or name}"
            if fixer is None:
                result.manual.append(f)
                continue
            if f.rule in dropped:
                result.skipped.append(f"{name}: {label}: {fixer.summary}: not fixed: {dropped[f.rule]}")
                continue
            waiver = _waived(f, current, options)
            if waiver is not None:
                result.skipped.append(f"{name}: {label}: {fixer.summary}: not fixed: waived ({waiver.reason}; "
                                      f"{waiver.origin}); name the rule (--only {f.rule}) to fix it anyway")
                continue
            if f.rule in guessed:
                continue  # the guess was the original guest's; a named fix may since have made it look surer
            if f.extra.get("guessed") and f.rule not in options.named_rules:
                guessed.add(f.rule)
                result.skipped.append(
                    f"{name}: {label}: {fixer.summary}: not fixed: {f.extra['guessed']}; name the rule "
                    f"(--only {f.rule}) to apply it"
                )
                continue
            if fixer.cpu_change and not options.allow_cpu_change:
                result.skipped.append(
                    f"{name}: {label}: {fixer.summary}: changes the guest's CPUs; only with --allow-cpu-change"
                )
                continue
            if fixer.bus_change and not options.allow_bus_change:
                result.skipped.append(
                    f"{name}: {label}: {fixer.summary}: changes the guest's hardware (drivers, device names); "
                    "only with --allow-bus-change"
                )
                continue
            try:
                what = fixer.func(FixCall(f, current, doc, options))
            except NotFixable as exc:
                doc.take_touched()
                result.skipped.append(f"{name}: {label}: not fixed automatically: {exc}")
                continue
            # a fixer that says nothing still gets a reason line: its own summary
            said = what.strip() or fixer.summary
            result.reasons.append(Reason(f"{label}: {said}", tuple(doc.take_touched())))
            result.fixed.append((fixer, f, said))
            fixed.add(_key(f))
        current = _read(doc.tree, where, origin_kind, on_host)
    # a rule that raised (the engine's guard) or a host fact unreadable: said in the plan, not dropped
    result.skipped.extend(f"{name}: {err}" for err in dict.fromkeys(ctx.errors))
    if not doc.changed:
        return guest, result, set()
    after = doc.render()  # checked to parse to the same document as the edited tree
    if settled is None:
        final = _read(parse_xml_bytes(after, where), where, origin_kind, on_host)
        settled = run_rules(ctx, [final], rules=guest_rules)
    # A finding a fixer handled that is still there at the same place means the fix did not work.
    fixed_at = {(rule, evidence) for rule, evidence, _actual in fixed}
    left = {f.rule for f in settled if (f.rule, f.evidence) in fixed_at}
    if left:
        return guest, result, left
    result.after = after
    return guest, result, set()


def _waived(f: Finding, guest: Guest, options: FixOptions) -> Waiver | None:
    """The live waiver that accepts ``f`` (settings file or the guest's own <metadata>), unless its rule is named."""
    if not options.use_waivers or f.rule in options.named_rules:
        return None
    return live_waiver(f, [*options.waivers, *guest_waivers([guest], [])], guest, date.today())


def _merge(plan: Plan, result: GuestFix) -> None:
    plan.skipped.extend(result.skipped)
    plan.manual += len(result.manual)


def plan_files(paths: Sequence[str], rules: Sequence[type[Rule]], options: FixOptions, plan: Plan) -> None:
    """Plan an atomic rewrite of each domain XML file; raises InputError on the first bad file."""
    seen: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        try:
            real = path.resolve()
        except OSError as exc:
            raise InputError(raw, exc.strerror or str(exc)) from None
        if real in seen:
            continue
        seen.add(real)
        if path.is_dir():
            raise InputError(raw, "is a directory (give domain XML files)")
        try:
            state, dir_id = read_state_and_dir(real, limit=MAX_XML_BYTES)
        except PermissionError:
            raise InputError(raw, "not readable (permission denied)") from None
        except OSError as exc:
            raise InputError(raw, str(exc)) from None
        if state.data is None:
            raise InputError(raw, "no such file")
        utf16 = utf16_of(state.data)  # edited as UTF-8, written back as the UTF-16 it was
        data = state.data if utf16 is None else utf16.to_utf8(state.data)
        guest, result = fix_guest(data, raw, "xml", rules, options)
        _merge(plan, result)
        if result.after is None:
            continue
        if utf16 is not None:
            result.after = utf16.back(result.after)
        change: Change[Any] = XmlFileEdit(
            path=real,
            shown=raw,
            before=state,
            after=result.after,
            reasons=result.reasons,
            notes=["takes effect when the domain is defined from this file and (re)started"],
            domain=guest.name,
            planned=result.planned(guest.name, origin="xml", active=False),
            dir_id=dir_id,
        )
        plan.changes.append(change)


def _libvirt_note(active: bool, live_rules: set[str], live: bool) -> str:
    if not active:
        return "the persistent definition changes; the guest picks it up when it is next started"
    if live_rules:
        return (f"running: {', '.join(sorted(live_rules))} also set live (the change after this one); the rest of the "
                "new definition applies after the guest is shut down and started again")
    return ("running: not changed live" + ("" if live else " (no --live)") + "; the new definition applies after the "
            "guest is shut down and started again (a reboot inside the guest is not enough)")


def plan_libvirt(
    uri: str, names: Sequence[str], rules: Sequence[type[Rule]], options: FixOptions, plan: Plan
) -> None:
    """Plan ``defineXML`` of each named (or every persistent) domain of ``uri``."""
    from kvmtune.fix.libvirt_rw import all_domains, inactive_xml, lookup_name, open_rw

    conn = open_rw(uri)
    try:
        doms = [lookup_name(conn, n, uri) for n in names] if names else all_domains(conn, uri)
        for dom in doms:
            name = dom.name()
            if not dom.isPersistent():
                plan.skipped.append(f"{name}: transient domain (no persistent definition to change); left alone")
                continue
            xml = inactive_xml(dom)
            where = f"{uri}#{name}"
            _guest, result = fix_guest(xml.encode("utf-8"), where, "libvirt", rules, options)
            _merge(plan, result)
            if result.after is None:
                continue
            active = bool(dom.isActive())
            lives: list[LiveSet] = []
            live_rules: set[str] = set()
            if active and options.live:
                lives, live_rules, cannot = live_changes(
                    dom, uri, result.after, [(fx.live, f.rule, said) for fx, f, said in result.fixed])
                plan.skipped.extend(cannot)
            planned = result.planned(name, origin="libvirt", active=active, live=frozenset(live_rules))
            plan.changes.append(
                XmlEdit(
                    uri=uri,
                    name=name,
                    uuid=dom.UUIDString(),
                    before=xml,
                    after=result.after.decode("utf-8"),
                    active=active,
                    reasons=result.reasons,
                    notes=[_libvirt_note(active, live_rules, options.live)],
                    planned=planned,
                )
            )
            for change in lives:
                change.planned = [p for p in planned if p.rule in change.rules]
            plan.changes.extend(lives)
    finally:
        conn.close()
