"""``kvmtune undo ID`` / ``kvmtune undo --list``: restore what a ``fix --apply`` changed."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from kvmtune.fix.journal import DEFAULT_DIR, ENV_DIR, journal_dir, list_journals, load, locked
from kvmtune.textsafe import safe


def register(sub: Any) -> None:
    p = sub.add_parser(
        "undo",
        help="restore exactly what a 'kvmtune fix --apply' changed (or list the journals)",
        description="Restore the files, runtime values, domain definitions and images a 'kvmtune fix --apply' "
        "changed, from its journal. Works on a partly applied journal too.",
    )
    p.add_argument("id", nargs="?", metavar="ID", help="journal id printed by 'kvmtune fix --apply'")
    p.add_argument("--list", action="store_true", help="list the journals, oldest first")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation (asked only on a terminal)")
    p.add_argument("--force", action="store_true",
                   help="restore even what was changed again after kvmtune changed it")
    p.add_argument("--purge-backups", action="store_true",
                   help="delete the original images journal ID keeps (its image changes can no longer be undone)")
    p.add_argument("--journal-dir", default=None, metavar="DIR",
                   help=f"where journals are (default ${ENV_DIR} or {DEFAULT_DIR})")
    p.add_argument("--root", default="/", metavar="DIR",
                   help=f"the tree 'kvmtune fix --root DIR --apply' changed: its journals are in DIR{DEFAULT_DIR}")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.root):
        print(f"kvmtune: error: --root {args.root}: not a directory", file=sys.stderr)
        return 2
    directory = journal_dir(args.journal_dir, root=args.root)
    if args.list:
        if args.id or args.purge_backups:
            print("kvmtune: error: --list takes no ID", file=sys.stderr)
            return 2
        found = list_journals(directory)
        if not found:
            print(f"no journals in {directory}")
        for jid, journal, problem in found:
            if journal is None:
                print(f"{jid}  refused   {safe(problem)}")
                continue
            cmd = " ".join(journal.argv[1:]) if journal.argv else ""
            where = f"  (in the tree {journal.root}, not this host)" if journal.root != "/" else ""
            summary = safe(journal.summary())
            print(f"{jid}  {journal.state:<15} {len(journal.entries):>3} change(s): {summary}  [{safe(cmd)}]{safe(where)}")
        return 0
    if not args.id:
        print("kvmtune: error: give a journal ID (see 'kvmtune undo --list')", file=sys.stderr)
        return 2
    # a bad id, a corrupt or untrusted journal, one made for another root or reaching outside its own:
    # one line, before anything else (the journal is read and checked whole, then acted on)
    load(args.id, directory, root=args.root)
    with locked(directory):
        return _undo(args, directory)


def _undo(args: argparse.Namespace, directory: Path) -> int:
    journal = load(args.id, directory, root=args.root)
    if args.purge_backups:
        from kvmtune.fix.undo import purge_backups

        for line in purge_backups(journal) or ["no image backups to delete"]:
            print(safe(line))
        return 0
    if journal.state == "undone":
        print(f"journal {journal.id} was undone already; nothing to do")
        return 0
    if journal.state == "applying":
        print(f"journal {journal.id} was interrupted while applying; restoring what it may have changed")
    from kvmtune.fix.undo import undo_journal

    if not args.yes and sys.stdin.isatty():
        sys.stderr.write(f"Undo the {len(journal.entries)} change(s) of journal {journal.id} "
                         f"({journal.summary()})? [y/N] ")
        sys.stderr.flush()
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            print("Aborted; nothing restored.")
            return 1
    done, problems = undo_journal(journal, force=args.force)
    for line in done:
        print(safe(line))
    for line in problems:
        print(f"kvmtune: {safe(line)}", file=sys.stderr)
    if problems:
        print(f"kvmtune: journal {journal.id}: {len(problems)} change(s) not restored", file=sys.stderr)
        return 1
    print(f"Undone: journal {journal.id}.")
    return 0
