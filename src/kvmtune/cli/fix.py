"""``kvmtune fix``: show the changes that fix the findings; ``--apply`` makes them, journaled."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from kvmtune.audit.engine import select_rules
from kvmtune.errors import KvmtuneError
from kvmtune.fix.apply import ApplyFailed, apply_plan
from kvmtune.fix.journal import DEFAULT_DIR, ENV_DIR, journal_dir, locked
from kvmtune.fix.plan import Plan
from kvmtune.fix.registry import FixOptions
from kvmtune.host.root import HostRoot
from kvmtune.host.settings import PROFILES as HOST_PROFILES
from kvmtune.textsafe import safe, safe_block

EXIT_APPLY_FAILED = 3


def register(sub: Any) -> None:
    p = sub.add_parser(
        "fix",
        help="show (and with --apply make) the changes that fix the findings; reversible with 'kvmtune undo'",
        description="Plan fixes for what 'kvmtune audit' finds and print them as a diff. Nothing changes "
        "without --apply; every --apply writes a journal first, so 'kvmtune undo ID' restores exactly.",
    )
    p.add_argument("paths", nargs="*", metavar="PATH", help="domain XML files to fix in place")
    p.add_argument("-c", "--connect", action="append", default=[], metavar="URI",
                   help="libvirt URI whose persistent domain definitions to fix (repeatable)")
    p.add_argument("--domain", action="append", default=[], metavar="NAME",
                   help="only this domain of --connect (repeatable)")
    p.add_argument("--host", action="store_true", help="plan host drop-ins and runtime values for --profile")
    p.add_argument("--profile", choices=HOST_PROFILES, default=None,
                   help="host profile (default virtual-host); implies --host")
    p.add_argument("--images", nargs="+", default=[], metavar="IMAGE",
                   help="preallocate these disk images (qcow2 → preallocation=metadata, raw → falloc)")
    p.add_argument("--format", dest="image_format", choices=("raw", "qcow2"), default=None,
                   help="the declared format of the --images (default: from the domain XML files given that use "
                   "them); an image whose format is not declared is left alone, never guessed from its contents")
    p.add_argument("--root", default="/", metavar="DIR",
                   help="host root (a captured or fixture tree) for --host, the rules and the image in-use check")
    p.add_argument("--apply", action="store_true", help="make the changes (after a confirmation, see --yes)")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--patch", action="store_true",
                   help="print only the file changes, as a patch 'git apply' and 'patch -p1' accept (paths relative "
                   "to the current directory, or to / for files outside it)")
    p.add_argument("--only", default="", metavar="RULES", help="comma-separated rule ids, slugs or prefixes to fix")
    p.add_argument("--skip", default="", metavar="RULES", help="comma-separated rule ids, slugs or prefixes to leave")
    p.add_argument("--allow-bus-change", action="store_true",
                   help="also change what the guest sees (disk bus ide/sata → virtio and hda → vda, NIC model, SCSI "
                   "controller, CPU model, TCG → KVM): the guest needs virtio drivers, device names change")
    p.add_argument("--purge-backups", action="store_true",
                   help="with --images --apply: delete each original image once its copy is verified (not undoable)")
    p.add_argument("--journal-dir", default=None, metavar="DIR",
                   help=f"where journals go (default ${ENV_DIR} or {DEFAULT_DIR})")
    p.set_defaults(func=run)


def _split(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _argv(args: argparse.Namespace) -> list[str]:
    out = ["kvmtune", "fix", *args.paths]
    for uri in args.connect:
        out += ["--connect", uri]
    for d in args.domain:
        out += ["--domain", d]
    if args.host or args.profile:
        out += ["--host", "--profile", args.profile or "virtual-host"]
    if args.images:
        out += ["--images", *args.images]
    if args.image_format:
        out += ["--format", args.image_format]
    if args.root != "/":
        out += ["--root", args.root]
    for flag in ("only", "skip"):
        if getattr(args, flag):
            out += [f"--{flag}", getattr(args, flag)]
    if args.allow_bus_change:
        out.append("--allow-bus-change")
    return out


def build_plan(args: argparse.Namespace) -> Plan:
    from kvmtune.fix.domains import plan_files, plan_libvirt
    from kvmtune.fix.host import plan_host
    from kvmtune.fix.images import declared_formats, plan_images
    from kvmtune.runner import default_runner

    if not os.path.isdir(args.root):
        raise KvmtuneError(f"--root {args.root}: not a directory")
    # absolute before planning: the journal holds absolute paths only, undo may run from anywhere
    args.root = os.path.realpath(args.root)
    rules = select_rules(_split(args.only), _split(args.skip))
    options = FixOptions(allow_bus_change=args.allow_bus_change, host=HostRoot(args.root))
    plan = Plan()
    if args.paths:
        plan_files(args.paths, rules, options, plan)
    for uri in args.connect:
        plan_libvirt(uri, args.domain, rules, options, plan)
    if args.host or args.profile:
        host_plan = plan_host(args.root, args.profile or "virtual-host")
        plan.changes.extend(host_plan.changes)
        plan.skipped.extend(host_plan.skipped)
        plan.notes.extend(host_plan.notes)
    if args.images:
        given = args.image_format
        formats = {p: given for p in args.images} if given else declared_formats(args.paths)
        before = len(plan.skipped)
        plan_images(args.images, default_runner(), HostRoot(args.root), plan, formats)
        args.refused_images = plan.skipped[before:]  # in use, short of space, undeclared format, ...
    return plan


def _confirm(n: int) -> bool:
    if not sys.stdin.isatty():
        raise KvmtuneError("--apply needs a confirmation and standard input is not a terminal; add --yes")
    sys.stderr.write(f"Apply these {n} change(s)? [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline().strip().lower()
    return answer in ("y", "yes")


def run(args: argparse.Namespace) -> int:
    if args.domain and not args.connect:
        print("kvmtune: error: --domain needs --connect URI", file=sys.stderr)
        return 2
    if args.purge_backups and not args.images:
        print("kvmtune: error: --purge-backups goes with --images (or use 'kvmtune undo --purge-backups ID')",
              file=sys.stderr)
        return 2
    if not (args.paths or args.connect or args.host or args.profile or args.images):
        print("kvmtune: error: nothing to fix: give domain XML files, --connect URI, --host or --images",
              file=sys.stderr)
        return 2
    if args.patch and args.apply:
        print("kvmtune: error: --patch prints a patch to apply elsewhere; it does not go with --apply", file=sys.stderr)
        return 2
    from kvmtune.cli.audit import domain_files_among_images

    moved = domain_files_among_images(args)
    plan = build_plan(args)
    out = sys.stdout
    if args.patch:
        from kvmtune.fix.patch import render_patch

        out.write(render_patch(plan, Path.cwd()))
        return 0
    for m in moved:
        out.write(f"note: {safe(m)}: named after --images but a .xml file, fixed as a domain definition\n")
    if os.path.realpath(args.root) != "/":
        out.write(f"host root: {safe(args.root)} (a tree, not this host: every host path below is inside it)\n")
    if plan.changes:
        out.write(safe_block(plan.render()))
    for line in plan.skipped:
        out.write(f"skipped: {safe(line)}\n")
    for line in plan.notes:
        out.write(f"note: {safe(line)}\n")
    if plan.manual:
        out.write(f"{plan.manual} finding(s) have no automatic fix; 'kvmtune audit' explains them\n")
    refused = list(getattr(args, "refused_images", None) or [])
    if not plan.changes:
        if args.apply and refused:
            out.write(f"Nothing changed: {len(refused)} image(s) not converted (the 'skipped:' lines say why).\n")
            return EXIT_APPLY_FAILED
        out.write("Nothing to change.\n")
        return 0
    restarts = sum(1 for c in plan.changes if c.kind == "domain" and getattr(c, "active", False))
    if not args.apply:
        out.write(f"{len(plan.changes)} change(s) planned; nothing changed (run again with --apply).\n")
        return 0
    if not args.yes and not _confirm(len(plan.changes)):
        out.write("Aborted; nothing changed.\n")
        return 1
    out.flush()
    # the tree is the journal's root only for the host changes made in it; domain files, libvirt domains
    # and images are this host's, whatever --root the rules read (a tree's journal names only paths in it)
    root = args.root if (args.host or args.profile) else "/"
    directory = journal_dir(args.journal_dir, root=root)
    try:
        with locked(directory):
            journal = apply_plan(plan, directory, argv=_argv(args), root=root, purge_backups=args.purge_backups)
    except ApplyFailed as exc:
        j = exc.journal
        made = sum(1 for e in j.entries if e.status == "done")
        print(f"kvmtune: apply stopped: {safe(exc)}", file=sys.stderr)
        print(
            f"kvmtune: {made} of {len(j.entries)} change(s) were made; journal {j.id} "
            f"({safe(str(j.path))}); '{safe(j.undo_command())}' restores them",
            file=sys.stderr,
        )
        return EXIT_APPLY_FAILED
    out.write(f"Applied {len(journal.entries)} change(s). Journal {journal.id} ({safe(str(journal.path))}).\n")
    out.write(f"Undo with: {safe(journal.undo_command())}\n")
    if restarts:
        out.write(f"{restarts} running domain(s) use the new definition only after a shutdown and start.\n")
    if refused:
        print(f"kvmtune: {len(refused)} image(s) not converted (the 'skipped:' lines say why)", file=sys.stderr)
        return EXIT_APPLY_FAILED
    return 0

