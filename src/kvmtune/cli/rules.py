"""``kvmtune rules list`` / ``kvmtune rules explain ID``."""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from typing import Any

from kvmtune.audit.rule import all_rules, rule_by_id


def register(sub: Any) -> None:
    p = sub.add_parser("rules", help="list the audit rules or explain one")
    rs = p.add_subparsers(dest="rules_cmd", metavar="ACTION", parser_class=type(p))
    ls = rs.add_parser("list", help="one line per rule")
    ls.add_argument("--topic", help="only rules of this topic")
    ls.add_argument("--format", choices=("text", "json"), default="text")
    ls.set_defaults(func=run_list)
    ex = rs.add_parser("explain", help="print a rule's documentation")
    ex.add_argument("rule", metavar="ID", help="rule id (KVM-STO-002) or slug (disk-cache-writethrough)")
    ex.set_defaults(func=run_explain)
    p.set_defaults(func=lambda _a: (p.print_help(), 2)[1])


def run_list(args: argparse.Namespace) -> int:
    rules = all_rules()
    if args.topic and not any(r.topic == args.topic for r in rules):
        close = difflib.get_close_matches(args.topic, sorted({r.topic for r in rules}), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        print(f"kvmtune: error: --topic {args.topic}: no rule has this topic{hint}", file=sys.stderr)
        return 2
    chosen = [r for r in rules if not args.topic or r.topic == args.topic]
    if args.format == "json":
        print(json.dumps({"schema_version": 1, "rules": [
            {"id": r.id, "slug": r.slug, "topic": r.topic, "severity": str(r.severity),
             "severity_range": r.severity_label(), "scope": r.scope, "title": r.title,
             "fix_kind": r.fix_kind, "references": list(r.references)} for r in chosen]}, indent=2))
        return 0
    print(f"{'ID':12} {'SEVERITY':15} {'SCOPE':6} {'TOPIC':20} {'SLUG':32} TITLE")
    for r in chosen:
        print(f"{r.id:12} {r.severity_label():15} {r.scope:6} {r.topic:20} {r.slug:32} {r.title}")
    return 0


def run_explain(args: argparse.Namespace) -> int:
    rule = rule_by_id(args.rule)
    if rule is None:
        print(f"kvmtune: error: no rule {args.rule!r} (see 'kvmtune rules list')", file=sys.stderr)
        return 2
    sys.stdout.write(rule.doc())
    return 0
