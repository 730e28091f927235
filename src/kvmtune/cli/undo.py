"""``kvmtune undo ID`` / ``kvmtune undo --list``: restore what a ``fix --apply`` changed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvmtune.cli.command import Command, Exit, Outcome, journal_dir_option, root_option, settings_journal_dir
from kvmtune.errors import UsageError
from kvmtune.fix.journal import DEFAULT_DIR, ENV_DIR, journal_dir, list_journals, load, locked
from kvmtune.textsafe import safe


class UndoCommand(Command):
    name = "undo"
    help = "restore exactly what a 'kvmtune fix --apply' changed (or list the journals)"
    uses_settings = True
    description = ("Restore the files, runtime values, domain definitions and images a 'kvmtune fix --apply' "
                   "changed, from its journal. Works on a partly applied journal too.")

    def options(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("id", nargs="?", metavar="ID", help="journal id printed by 'kvmtune fix --apply'")
        p.add_argument("--list", action="store_true", help="list the journals, oldest first")
        p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation (asked only on a terminal)")
        p.add_argument("--force", action="store_true",
                       help="restore even what was changed again after kvmtune changed it")
        p.add_argument("--purge-backups", action="store_true",
                       help="delete the original images journal ID keeps (its image changes can no longer be undone)")
        journal_dir_option(p, DEFAULT_DIR, ENV_DIR)
        root_option(p, f"the tree 'kvmtune fix --root DIR --apply' changed: its journals are in DIR{DEFAULT_DIR}")

    def check(self, args: argparse.Namespace) -> None:
        if args.list and (args.id or args.purge_backups):
            raise UsageError("--list takes no ID")
        if not args.list and not args.id:
            raise UsageError("give a journal ID (see 'kvmtune undo --list')")

    def run(self, args: argparse.Namespace) -> Outcome:
        directory = journal_dir(settings_journal_dir(args), root=args.root)
        if args.list:
            return Outcome(result=_listing(directory))
        # a bad id, a corrupt or untrusted journal, one made for another root or reaching outside its own:
        # one line, before anything else (the journal is read and checked whole, then acted on)
        load(args.id, directory, root=args.root)
        with locked(directory):
            return _undo(args, directory)


COMMANDS = (UndoCommand,)


def _listing(directory: Path) -> str:
    found = list_journals(directory)
    if not found:
        return f"no journals in {safe(directory)}\n"
    lines = []
    for jid, journal, problem in found:
        if journal is None:
            lines.append(f"{jid}  refused   {safe(problem)}")
            continue
        cmd = " ".join(journal.argv[1:]) if journal.argv else ""
        where = f"  (in the tree {journal.root}, not this host)" if journal.root != "/" else ""
        summary = safe(journal.summary())
        lines.append(f"{jid}  {journal.state:<15} {len(journal.entries):>3} change(s): {summary}  [{safe(cmd)}]{safe(where)}")
    return "".join(f"{line}\n" for line in lines)


def _undo(args: argparse.Namespace, directory: Path) -> Outcome:
    journal = load(args.id, directory, root=args.root)
    if args.purge_backups:
        from kvmtune.fix.undo import purge_backups

        return Outcome(result="".join(f"{safe(line)}\n" for line in purge_backups(journal) or ["no image backups to delete"]))
    if journal.state == "undone":
        return Outcome(result=f"journal {journal.id} was undone already; nothing to do\n")
    if journal.state == "applying":
        print(f"journal {journal.id} was interrupted while applying; restoring what it may have changed")
    from kvmtune.fix.undo import undo_journal

    if not args.yes and sys.stdin.isatty():
        sys.stderr.write(f"Undo the {len(journal.entries)} change(s) of journal {journal.id} "
                         f"({journal.summary()})? [y/N] ")
        sys.stderr.flush()
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            return Outcome(Exit.FINDINGS, "Aborted; nothing restored.\n")
    done, problems = undo_journal(journal, force=args.force)
    text = "".join(f"{safe(line)}\n" for line in done)
    if problems:
        return Outcome(Exit.FINDINGS, text, [*problems, f"journal {journal.id}: {len(problems)} change(s) not restored"])
    return Outcome(result=text + f"Undone: journal {journal.id}.\n")
