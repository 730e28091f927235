#!/usr/bin/env python3
"""Write the files of a new guest rule, ready for its logic (docs/architecture.md §9, "A rule").

    tools/new_rule.py KVM-STO-030 disk-something --group storage --topic disk-cache [--fixer]

writes

* ``src/kvmtune/rules/<group>/<slug>.py``: the rule class (``fix_kind = "manual"``, or with ``--fixer``
  ``"xml"`` and a ``verify = NoExperiment(...)`` to replace by what ``kvmtune verify`` measures), with the
  names it uses only in annotations imported under ``if TYPE_CHECKING:`` like every rule module;
* ``src/kvmtune/rules/<group>/<slug>.md``: its doc with the seven headings;
* ``tests/rules/<ID>/bad/<slug>.xml`` and ``good/<slug>.xml``: fixtures to make show (or not) the problem;
* with ``--fixer``: a fixer stub at the end of ``src/kvmtune/fix/fixers/<group>.py`` and a golden pair
  ``tests/fix/golden/<ID>/<slug>.in.xml`` / ``.out.xml``; and it names the eighth file, written by hand:
  ``tests/fix/golden/ALL/legacy-everything.out.xml``, every fixer at once, which takes the new fixer's edit
  when the new check fires on ``legacy-everything.in.xml``.

``--topic`` is required: a rule's topic says what it is about (``balloon``, not its group's commonest).

Every placeholder says ``TODO``. The contract tests (``tests/rules``, ``tests/fix/test_remedies.py``,
``tests/fix/test_fix_golden.py``, ``tests/verify/test_verify_plans.py``) then fail only until the check,
the fixer and the fixtures are written. Host and image rules have no scaffold (their fixtures are host
trees and real images). An id or slug that exists, or does not match the patterns, is refused; nothing
is written then.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from kvmtune.audit.finding import TOPICS  # noqa: E402
from kvmtune.audit.rule import all_rules  # noqa: E402

ID_RE = re.compile(r"KVM-[A-Z]{3}-\d{3}")
SLUG_RE = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
RULES = REPO / "src" / "kvmtune" / "rules"
FIXERS = REPO / "src" / "kvmtune" / "fix" / "fixers"
NOT_GUEST = {"host": "host rules are judged on host trees", "image": "image rules are judged on real images"}

# names used only in annotations are imported under TYPE_CHECKING: `kvmtune rules list` and every audit import all
# rule modules, and the type-only imports (audit.context and what it pulls in) would cost each of them (issue 38)
RULE = '''from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
{verify_import}
if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class {cls}(GuestRule):
    id = "{id}"
    slug = "{slug}"
    topic = "{topic}"
    severity = Severity.MEDIUM
    title = "TODO: the problem in one line, as the report shows it"
    why = "TODO: why it costs speed or safety: the mechanism, with numbers where there are some"
    fix_kind = "{fix_kind}"
    fix_description = "TODO: what to change instead, and when to keep it as it is"
    fix_safe = False
    references = ("TODO: where the advice comes from (documentation, source file, seed:NNN)",)
{verify}
    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        # TODO: one finding per problem, e.g.
        # yield self.finding(target=self.target(guest), actual="...", expected="...", evidence="/domain/...",
        #                    source=guest.origin)
        return iter(())
'''

VERIFY = '''    # TODO: what `kvmtune verify` measures for the fix (audit/verifyplan.py), or why nothing, in one line
    verify = NoExperiment("TODO: not measured yet")
'''

DOC = """# {id} {slug}

## What it does
TODO: what the rule flags, in domain XML and on QEMU command lines, and what it leaves alone.

## Why it matters
TODO: the cost of the setting, and where the numbers come from.

## Example
```xml
TODO: the flagged configuration
```

## Use instead
```xml
TODO: the recommended configuration
```

## Fix safety
{safety}

## Evidence read
TODO: the XPath(s) and command-line options the check reads.

## References
- TODO: the sources of the advice.{effect}
"""
# the platform's rule a libvirt XML fixer follows (tests/fix/test_takes_effect.py); a Proxmox VE form adds its own
EFFECT_XML = ("\n- When it takes effect: libvirt applies a changed persistent definition (`virsh define`, `--config`) at "
              "the domain's next start, not to the running domain (libvirt \"Domain XML format\"; `virsh(1)`, `--config` "
              "against `--live`): `kvmtune fix` plans it `restart` on a running domain, `live` on a stopped one, "
              "`new-instances` for a domain file.")
SAFETY_XML = "TODO: is the change safe for data and for the guest; when does it take effect. Reversible with `kvmtune undo`."
SAFETY_MANUAL = "TODO: kvmtune does not change this itself: say why, and what the user checks before changing it."

DOMAIN = """<!-- {id} {kind}: TODO make this domain {what} -->
<domain type='kvm'>
  <name>{slug}-{kind}</name>
  <metadata>
    <app:owner xmlns:app='http://example.org/app'>kept byte for byte by the fix</app:owner>
  </metadata>
  <memory unit='GiB'>2</memory>
  <vcpu>2</vcpu>
  <os><type arch='x86_64' machine='pc-q35-8.2'>hvm</type></os>
  <cpu mode='host-passthrough'/>
  <devices>
  </devices>
</domain>
"""
GOLDEN_OUT_NOTE = "<!-- TODO: {id} golden output: the input as the fixer must write it, byte for byte -->\n"

FIXER_HEAD = '''"""Fixes for the {group} rules."""

from __future__ import annotations

from kvmtune.fix.registry import FixCall, NotFixable, xml_fixer
'''
FIXER = '''

@xml_fixer("{id}", "TODO: what the fix changes, in one line")
def {func}(call: FixCall) -> str:
    # TODO: edit call.doc (set_attr, set_text, append, remove, ...) and return one line saying what changed;
    # raise NotFixable("why") for an instance kvmtune must leave alone
    raise NotFixable("{id}: the fixer is not written yet")
'''


class Refused(Exception):
    """The scaffold will not write these files; ``str()`` is the one line that says why."""


def guest_groups() -> list[str]:
    return sorted(p.name for p in RULES.iterdir() if (p / "__init__.py").is_file() and p.name not in NOT_GUEST)


def group_topics(group: str) -> list[str]:
    return sorted({r.topic for r in all_rules() if r.__module__.startswith(f"kvmtune.rules.{group}.")})


ALL_GOLDEN = REPO / "tests" / "fix" / "golden" / "ALL" / "legacy-everything.out.xml"
ALL_NOTE = ("new_rule: when the new check fires on {inp}, the new fixer's edit belongs in {out} too (every fixer at "
            "once; tests/fix/test_fix_golden.py's ALL/legacy-everything fails until it is)")


def check(rule_id: str, slug: str, group: str, topic: str | None, fixer: bool) -> dict[Path, str]:
    """The files to write (path -> text; an existing fixers file: its text with the stub appended)."""
    if not ID_RE.fullmatch(rule_id):
        raise Refused(f"{rule_id!r}: a rule id looks like KVM-STO-030 (KVM-, three capitals, -, three digits)")
    if not SLUG_RE.fullmatch(slug):
        raise Refused(f"{slug!r}: a slug is lower-case words joined by single hyphens (disk-cache-unsafe)")
    if group in NOT_GUEST:
        raise Refused(f"--group {group}: the scaffold makes guest rules; {NOT_GUEST[group]} (docs/architecture.md §9)")
    if group not in guest_groups():
        raise Refused(f"--group {group}: not a rule group (one of {', '.join(guest_groups())})")
    if topic is None:
        raise Refused(f"--topic: required, one of audit/finding.py TOPICS (the {group} group's so far: "
                      f"{', '.join(group_topics(group))})")
    if topic not in TOPICS:
        raise Refused(f"--topic {topic}: not a topic of audit/finding.py TOPICS")
    for r in all_rules():
        if r.id == rule_id:
            raise Refused(f"{rule_id}: the id is taken by {r.slug} ({r.__module__})")
        if r.slug == slug:
            raise Refused(f"{slug}: the slug is taken by {r.id} ({r.__module__})")
    module = slug.replace("-", "_")
    files = {
        RULES / group / f"{module}.py": RULE.format(
            id=rule_id, slug=slug, topic=topic, cls="".join(w.capitalize() for w in slug.split("-")),
            fix_kind="xml" if fixer else "manual", verify=VERIFY if fixer else "",
            verify_import="from kvmtune.audit.verifyplan import NoExperiment\n" if fixer else "",
        ),
        RULES / group / f"{module}.md": DOC.format(id=rule_id, slug=slug, safety=SAFETY_XML if fixer else SAFETY_MANUAL,
                                                 effect=EFFECT_XML if fixer else ""),
        REPO / "tests" / "rules" / rule_id / "bad" / f"{slug}.xml": DOMAIN.format(
            id=rule_id, slug=slug, kind="bad", what="show the problem"),
        REPO / "tests" / "rules" / rule_id / "good" / f"{slug}.xml": DOMAIN.format(
            id=rule_id, slug=slug, kind="good", what="show the recommended setting"),
    }
    if fixer:
        golden = REPO / "tests" / "fix" / "golden" / rule_id
        files[golden / f"{slug}.in.xml"] = DOMAIN.format(id=rule_id, slug=slug, kind="bad", what="show the problem")
        files[golden / f"{slug}.out.xml"] = GOLDEN_OUT_NOTE.format(id=rule_id) + files[golden / f"{slug}.in.xml"]
        fixers = FIXERS / f"{group}.py"
        head = fixers.read_text(encoding="utf-8") if fixers.is_file() else FIXER_HEAD.format(group=group)
        if not fixers.is_file():
            head += "\n"
        files[fixers] = head.rstrip("\n") + "\n" + FIXER.format(id=rule_id, func=module)
    for path in files:
        if path.exists() and path.parent != FIXERS:
            raise Refused(f"{path.relative_to(REPO)}: already exists")
        if path.parent.name in ("bad", "good") and path.parent.parent.exists():
            raise Refused(f"{path.parent.parent.relative_to(REPO)}: already exists (fixtures of another rule?)")
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/new_rule.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("id", help="the new rule id, e.g. KVM-STO-030")
    parser.add_argument("slug", help="the new rule's slug, e.g. disk-something")
    parser.add_argument("--group", required=True, help="the rule group: a directory under src/kvmtune/rules")
    parser.add_argument("--topic", help="required: a topic of audit/finding.py TOPICS, what the rule is about")
    parser.add_argument("--fixer", action="store_true", help="also a fixer stub, a golden pair and fix_kind = 'xml'")
    args = parser.parse_args(argv)
    try:
        files = check(args.id, args.slug, args.group, args.topic, args.fixer)
    except Refused as exc:
        print(f"new_rule: {exc}", file=sys.stderr)
        return 2
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(path.relative_to(REPO))
    if args.fixer:
        print(ALL_NOTE.format(inp=ALL_GOLDEN.with_name("legacy-everything.in.xml").relative_to(REPO),
                              out=ALL_GOLDEN.relative_to(REPO)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
