"""``kvmtune rules list`` / ``kvmtune rules explain ID``."""

from __future__ import annotations

import argparse

from kvmtune.audit.rule import all_rules, rule_by_id
from kvmtune.cli.command import Command, Outcome, format_option
from kvmtune.errors import UsageError


class RulesListCommand(Command):
    name = "list"
    help = "one line per rule"

    def options(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--topic", help="only rules of this topic")
        format_option(p, ("text", "json"))

    def check(self, args: argparse.Namespace) -> None:
        rules = all_rules()
        if args.topic and not any(r.topic == args.topic for r in rules):
            import difflib

            close = difflib.get_close_matches(args.topic, sorted({r.topic for r in rules}), n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UsageError(f"--topic {args.topic}: no rule has this topic{hint}")

    def run(self, args: argparse.Namespace) -> Outcome:
        chosen = [r for r in all_rules() if not args.topic or r.topic == args.topic]
        if args.format == "json":
            import json

            return Outcome(result=json.dumps({"schema_version": 1, "rules": [
                {"id": r.id, "slug": r.slug, "topic": r.topic, "severity": str(r.severity),
                 "severity_range": r.severity_label(), "scope": r.scope, "title": r.title,
                 "fix_kind": r.fix_kind, "references": list(r.references)} for r in chosen]}, indent=2) + "\n")
        lines = [f"{'ID':12} {'SEVERITY':15} {'SCOPE':6} {'TOPIC':20} {'SLUG':32} TITLE"]
        lines += [f"{r.id:12} {r.severity_label():15} {r.scope:6} {r.topic:20} {r.slug:32} {r.title}" for r in chosen]
        return Outcome(result="".join(f"{line}\n" for line in lines))


class RulesExplainCommand(Command):
    name = "explain"
    help = "print a rule's documentation"

    def options(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("rule", metavar="ID", help="rule id (KVM-STO-002) or slug (disk-cache-writethrough)")

    def check(self, args: argparse.Namespace) -> None:
        if rule_by_id(args.rule) is None:
            raise UsageError(f"no rule {args.rule!r} (see 'kvmtune rules list')")

    def run(self, args: argparse.Namespace) -> Outcome:
        rule = rule_by_id(args.rule)
        assert rule is not None  # check() refused an unknown one
        return Outcome(result=rule.doc())


class RulesCommand(Command):
    name = "rules"
    help = "list the audit rules or explain one"
    subcommands = (RulesListCommand, RulesExplainCommand)


COMMANDS = (RulesCommand,)
