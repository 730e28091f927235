"""``kvmtune fix``: show the changes that fix the findings; ``--apply`` makes them, journaled."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from kvmtune.audit.collect import domain_files_among_images, kubevirt_paths
from kvmtune.audit.engine import select_rules
from kvmtune.audit.finding import Waiver
from kvmtune.cli.command import (
    Command,
    Exit,
    Outcome,
    format_option,
    journal_dir_option,
    root_option,
    settings_journal_dir,
    settings_of,
)
from kvmtune.errors import KvmtuneError, UsageError
from kvmtune.fix.apply import ApplyFailed, apply_plan
from kvmtune.fix.entries import KubectlEntry, QmEntry
from kvmtune.fix.journal import DEFAULT_DIR, ENV_DIR, journal_dir, locked
from kvmtune.fix.plan import Plan
from kvmtune.fix.pve import has_pve
from kvmtune.fix.registry import FixOptions
from kvmtune.host.root import HostRoot
from kvmtune.host.settings import PROFILES as HOST_PROFILES
from kvmtune.textsafe import safe, safe_block

IMAGE_FORMATS = ("raw", "qcow2")


class _OutputFormats(tuple[str, ...]):
    """``fix --format``'s choices: the output formats, and for one release the image formats it used to mean
    (accepted, not listed; :meth:`FixCommand.check` warns and treats them as ``--image-format``)."""

    def __contains__(self, value: object) -> bool:
        return value in IMAGE_FORMATS or super().__contains__(value)


class FixCommand(Command):
    name = "fix"
    help = "show (and with --apply make) the changes that fix the findings; reversible with 'kvmtune undo'"
    description = ("Plan fixes for what 'kvmtune audit' finds and print them as a diff. Nothing changes "
                   "without --apply; every --apply writes a journal first, so 'kvmtune undo ID' restores exactly.")
    uses_settings = True

    def options(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("paths", nargs="*", metavar="PATH",
                       help="domain XML files, or KubeVirt manifests (.yaml, .yml, .json) or directories of them, to fix "
                       "in place")
        p.add_argument("--recursive", action="store_true",
                       help="a directory of KubeVirt manifests: its whole tree (a GitOps repository), not one level")
        p.add_argument("--kubevirt", nargs="?", const="", default=None, metavar="CONTEXT",
                       help="fix the KubeVirt VMs of a cluster with 'kubectl patch --type merge' (the kubeconfig's "
                       "CONTEXT, default its current one), each guarded by the resourceVersion it was read at")
        p.add_argument("-c", "--connect", action="append", default=[], metavar="URI",
                       help="libvirt URI whose persistent domain definitions to fix (repeatable)")
        p.add_argument("--domain", action="append", default=[], metavar="NAME",
                       help="only this domain of --connect (repeatable)")
        p.add_argument("--host", action="store_true", help="plan host drop-ins and runtime values for --profile")
        p.add_argument("--profile", choices=HOST_PROFILES, default=None,
                       help="host profile (default virtual-host); implies --host")
        p.add_argument("--images", nargs="+", default=[], metavar="IMAGE",
                       help="preallocate these disk images (qcow2 → preallocation=metadata, raw → falloc)")
        p.add_argument("--image-format", choices=IMAGE_FORMATS, default=None,
                       help="the declared format of the --images (default: from the domain XML files given that use "
                       "them); an image whose format is not declared is left alone, never guessed from its contents")
        format_option(p, _OutputFormats(("text", "json")),
                      help="output format of the plan (default text); json: changes[] with guest, rule, target, what "
                      "and takes_effect")
        root_option(p, "host root (a captured or fixture tree) for --host, the rules and the image in-use check")
        p.add_argument("--apply", action="store_true", help="make the changes (after a confirmation, see --yes)")
        p.add_argument("--live", action="store_true",
                       help="with --connect: also make on a running domain the changes libvirt applies live (the "
                       "balloon's statistics period, KVM-MEM-013); those take effect at once, and undo reverses "
                       "them live; the others still wait for the domain's next start")
        p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
        p.add_argument("--status", action="store_true",
                       help="list the journaled changes that are still staged: a running libvirt domain whose live "
                       "XML lacks them, a Proxmox VE VM's pending keys, drop-ins read at the next boot")
        p.add_argument("--patch", action="store_true",
                       help="print only the file changes, as a patch 'git apply' and 'patch -p1' accept (paths relative "
                       "to the current directory, or to / for files outside it)")
        p.add_argument("--only", default="", metavar="RULES", help="comma-separated rule ids, slugs or prefixes to fix")
        p.add_argument("--skip", default="", metavar="RULES", help="comma-separated rule ids, slugs or prefixes to leave")
        p.add_argument("--no-waivers", action="store_true",
                       help="fix waived findings too (by default a waived finding is fixed only when --only names its rule)")
        p.add_argument("--allow-bus-change", action="store_true",
                       help="also change what the guest sees (disk bus ide/sata → virtio and hda → vda, NIC model, SCSI "
                       "controller): the guest needs virtio drivers, device names change")
        p.add_argument("--allow-cpu-change", action="store_true",
                       help="also change the guest's CPUs (CPU model → host-model, vCPU count lowered to this host's CPUs, "
                       "TCG → KVM): the guest sees other CPU features or fewer CPUs")
        p.add_argument("--pve-volume", action="append", default=[], metavar="PATH",
                       help="Proxmox VE: also change the drive whose volume is this host path or device (e.g. "
                       "/dev/disk/by-id/…); such drives are left alone unless named (repeatable)")
        p.add_argument("--assume-this-host", action="store_true",
                       help="domain files run on this host (as with audit): the rules that compare a guest with this "
                       "host's CPUs apply to them too")
        p.add_argument("--purge-backups", action="store_true",
                       help="with --images --apply: delete each original image once its copy is verified (not undoable)")
        journal_dir_option(p, DEFAULT_DIR, ENV_DIR)

    def check(self, args: argparse.Namespace) -> None:
        if args.status:
            if (args.apply or args.live or args.patch or args.paths or args.connect or args.host or args.profile
                    or args.images or args.kubevirt is not None):
                raise UsageError("--status lists what the journals hold; give it alone (with --journal-dir, --root)")
            return
        if args.domain and not args.connect:
            raise UsageError("--domain needs --connect URI")
        if args.live and not args.connect:
            raise UsageError("--live changes running libvirt domains: it needs --connect URI")
        if args.purge_backups and not args.images:
            raise UsageError("--purge-backups goes with --images (or use 'kvmtune undo --purge-backups ID')")
        if not (args.paths or args.connect or args.host or args.profile or args.images or args.kubevirt is not None
                or has_pve(args.root)):
            raise UsageError("nothing to fix: give domain XML files, KubeVirt manifests, --kubevirt, --connect URI, "
                             "--host or --images (or --root a tree with a Proxmox VE /etc/pve, or run on a Proxmox VE "
                             "node)")
        if args.kubevirt is not None and args.patch:
            raise UsageError("--patch prints file changes; --kubevirt changes a cluster with kubectl patch")
        if args.patch and args.apply:
            raise UsageError("--patch prints a patch to apply elsewhere; it does not go with --apply")
        if args.format == "json" and (args.apply or args.patch):
            raise UsageError("--format json prints the plan; it does not go with --apply or --patch")
        if args.format in IMAGE_FORMATS:
            if args.image_format and args.image_format != args.format:
                raise UsageError(f"--format {args.format} and --image-format {args.image_format}: give one image format")
            print(f"kvmtune: warning: --format {args.format} is the image format: use --image-format; "
                  "--format will mean the output format", file=sys.stderr)

    def run(self, args: argparse.Namespace) -> Outcome:
        if args.status:
            return _status(args)
        paths, images, moved = domain_files_among_images(args.paths, args.images)
        paths, manifests = kubevirt_paths(paths, args.recursive)
        settings = settings_of(args)
        spec = FixSpec(
            paths=paths, connect=list(args.connect), domains=list(args.domain), host=bool(args.host or args.profile),
            profile=args.profile or str(settings.get("profile")), images=images,
            image_format=args.image_format or (args.format if args.format in IMAGE_FORMATS else None),
            root=args.root, only=args.only, skip=args.skip, allow_bus_change=args.allow_bus_change,
            allow_cpu_change=args.allow_cpu_change, assume_this_host=args.assume_this_host,
            pve_volumes=tuple(args.pve_volume),
            pve=not (paths or manifests or args.kubevirt is not None or args.connect or args.host or args.profile
                     or images) and has_pve(args.root),
            manifests=manifests, recursive=args.recursive, kubevirt=args.kubevirt,
            waivers=() if args.no_waivers else tuple(settings.waivers), use_waivers=not args.no_waivers,
            live=args.live,
        )
        plan, refused = build_plan(spec)
        if args.patch:
            from kvmtune.fix.patch import render_patch

            return Outcome(result=render_patch(plan, Path.cwd()))
        if args.format == "json":
            return Outcome(result=json.dumps(plan.to_json(), indent=2) + "\n")
        text = "".join(f"note: {safe(m)}: named after --images but a .xml file, fixed as a domain definition\n"
                       for m in moved)
        if spec.root != "/":
            text += f"host root: {safe(spec.root)} (a tree, not this host: every host path below is inside it)\n"
        if plan.changes:
            text += safe_block(plan.render())
        text += "".join(f"skipped: {safe(line)}\n" for line in plan.skipped)
        text += "".join(f"note: {safe(line)}\n" for line in plan.notes)
        if plan.manual:
            text += f"{plan.manual} finding(s) have no automatic fix; 'kvmtune audit' explains them\n"
        if plan.refused:
            problem = f"{len(plan.refused)} manifest(s) or value(s) refused (the 'skipped:' lines say why)"
            if not plan.changes:
                return Outcome(Exit.INCOMPLETE, text + "Nothing changed.\n", [problem])
            if not args.apply:
                return Outcome(Exit.INCOMPLETE, text + f"{len(plan.changes)} change(s) planned; nothing changed (run "
                               "again with --apply).\n", [problem])
        if not plan.changes:
            if args.apply and refused:
                return Outcome(Exit.INCOMPLETE,
                               text + f"Nothing changed: {len(refused)} image(s) not converted (the 'skipped:' lines say why).\n")
            return Outcome(result=text + "Nothing to change.\n")
        if not args.apply:
            return Outcome(result=text + f"{len(plan.changes)} change(s) planned; nothing changed (run again with --apply).\n")
        # the plan is on the screen before the question and before anything changes
        sys.stdout.write(text)
        sys.stdout.flush()
        if not args.yes and not _confirm(len(plan.changes)):
            return Outcome(Exit.FINDINGS, "Aborted; nothing changed.\n")
        outcome = _apply(spec, plan, refused, settings_journal_dir(args), purge_backups=args.purge_backups)
        if plan.refused:
            outcome.exit = max(outcome.exit, Exit.INCOMPLETE)
            outcome.errors = [*outcome.errors, f"{len(plan.refused)} manifest(s) or value(s) refused (the 'skipped:' "
                              "lines say why)"]
        return outcome


COMMANDS = (FixCommand,)


@dataclass(frozen=True)
class FixSpec:
    """What to fix, as ``kvmtune fix`` was asked (``--images`` already stripped of domain files)."""

    paths: list[str]
    connect: list[str]
    domains: list[str]
    host: bool  # --host or --profile
    profile: str
    images: list[str]
    image_format: str | None
    root: str  # absolute
    only: str
    skip: str
    allow_bus_change: bool
    allow_cpu_change: bool = False
    assume_this_host: bool = False
    pve_volumes: tuple[str, ...] = ()  # --pve-volume: host paths or devices a Proxmox VE fix may change
    pve: bool = False  # the Proxmox VE VM configs of the --root tree
    waivers: tuple[Waiver, ...] = ()  # the settings file's; not part of the command line a journal records
    use_waivers: bool = True
    manifests: list[str] = field(default_factory=list)  # KubeVirt manifests or directories of them
    recursive: bool = False
    kubevirt: str | None = None  # --kubevirt CONTEXT ("": the current context)
    live: bool = False  # --live: running libvirt domains get the live-capable changes now too

    def argv(self) -> list[str]:
        """The command line a journal records (what 'undo --list' shows)."""
        out = ["kvmtune", "fix", *self.paths, *self.manifests]
        if self.recursive:
            out.append("--recursive")
        if self.kubevirt is not None:
            out += ["--kubevirt", *([self.kubevirt] if self.kubevirt else [])]
        for uri in self.connect:
            out += ["--connect", uri]
        for d in self.domains:
            out += ["--domain", d]
        if self.host:
            out += ["--host", "--profile", self.profile]
        if self.images:
            out += ["--images", *self.images]
        if self.image_format:
            out += ["--image-format", self.image_format]
        if self.root != "/":
            out += ["--root", self.root]
        if self.only:
            out += ["--only", self.only]
        if self.skip:
            out += ["--skip", self.skip]
        if self.allow_bus_change:
            out.append("--allow-bus-change")
        if self.allow_cpu_change:
            out.append("--allow-cpu-change")
        if self.assume_this_host:
            out.append("--assume-this-host")
        if self.live:
            out.append("--live")
        for volume in self.pve_volumes:
            out += ["--pve-volume", volume]
        return out


def _split(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def build_plan(spec: FixSpec) -> tuple[Plan, list[str]]:
    """The plan, and the images it refuses to convert (in use, short of space, undeclared format, ...)."""
    from kvmtune.fix.domains import plan_files, plan_libvirt
    from kvmtune.fix.host import plan_host
    from kvmtune.fix.images import declared_formats, plan_images
    from kvmtune.runner import default_runner

    rules = select_rules(_split(spec.only), _split(spec.skip))
    # a finding from a guessed guest identity is applied only when its rule is named by id or slug (a prefix is not a name)
    named = {r.id for r in rules if r.id in _split(spec.only) or r.slug in _split(spec.only)}
    options = FixOptions(allow_bus_change=spec.allow_bus_change, allow_cpu_change=spec.allow_cpu_change,
                         assume_this_host=spec.assume_this_host, host=HostRoot(spec.root), named_rules=frozenset(named),
                         waivers=spec.waivers, use_waivers=spec.use_waivers, pve_volumes=frozenset(spec.pve_volumes),
                         live=spec.live)
    plan = Plan()
    refused: list[str] = []
    if spec.paths:
        plan_files(spec.paths, rules, options, plan)
    if spec.manifests or spec.kubevirt is not None:
        from kvmtune.fix.kubevirt import plan_cluster, plan_manifests

        if spec.manifests:
            plan_manifests(spec.manifests, spec.recursive, rules, options, plan)
        if spec.kubevirt is not None:
            plan_cluster(spec.kubevirt or None, rules, options, plan)
    if spec.pve:
        from kvmtune.fix.pve import plan_pve

        plan_pve(spec.root, rules, options, plan)
    for uri in spec.connect:
        plan_libvirt(uri, spec.domains, rules, options, plan)
    if spec.host:
        host_plan = plan_host(spec.root, spec.profile)
        plan.changes.extend(host_plan.changes)
        plan.skipped.extend(host_plan.skipped)
        plan.notes.extend(host_plan.notes)
    if spec.images:
        given = spec.image_format
        formats = {p: given for p in spec.images} if given else declared_formats(spec.paths)
        before = len(plan.skipped)
        plan_images(spec.images, default_runner(), HostRoot(spec.root), plan, formats)
        refused = plan.skipped[before:]
    return plan, refused


def _confirm(n: int) -> bool:
    if not sys.stdin.isatty():
        raise KvmtuneError("--apply needs a confirmation and standard input is not a terminal; add --yes")
    sys.stderr.write(f"Apply these {n} change(s)? [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline().strip().lower()
    return answer in ("y", "yes")


def _apply(spec: FixSpec, plan: Plan, refused: list[str], journal_dir_arg: str | None, *, purge_backups: bool) -> Outcome:
    # the tree is the journal's root only for the host changes made in it; domain files, libvirt domains
    # and images are this host's, whatever --root the rules read (a tree's journal names only paths in it)
    root = spec.root if spec.host or spec.pve else "/"
    directory = journal_dir(journal_dir_arg, root=root)
    restarts = sum(1 for c in plan.changes if c.kind == "domain" and c.takes_effect() == "restart")
    try:
        with locked(directory):
            journal = apply_plan(plan, directory, argv=spec.argv(), root=root, purge_backups=purge_backups)
    except ApplyFailed as exc:
        j = exc.journal
        made = sum(1 for e in j.entries if e.status == "done")
        return Outcome(Exit.INCOMPLETE, errors=[
            f"apply stopped: {exc}",
            f"{made} of {len(j.entries)} change(s) were made; journal {j.id} ({j.path}); '{j.undo_command()}' restores them",
        ])
    text = f"Applied {len(journal.entries)} change(s). Journal {journal.id} ({safe(str(journal.path))}).\n"
    text += f"Undo with: {safe(journal.undo_command())}\n"
    if restarts:
        text += (f"{restarts} running domain(s) use the new definition only after a shutdown and start "
                 "('kvmtune fix --status' lists what is still staged).\n")
    for e in journal.entries:
        if isinstance(e, KubectlEntry) and e.restart_required:
            text += (f"KubeVirt VM {safe(e.namespace or 'default')}/{safe(e.name)}: RestartRequired (the change "
                     "reaches it at its next restart: virtctl restart; 'kvmtune fix --status' lists it until then).\n")
        if isinstance(e, QmEntry) and e.pending:
            text += (f"Proxmox VE VM {e.vmid}: {', '.join(e.pending)} pending until its next start "
                     f"(qm pending {e.vmid}).\n")
    if refused:
        return Outcome(Exit.INCOMPLETE, text, [f"{len(refused)} image(s) not converted (the 'skipped:' lines say why)"])
    return Outcome(result=text)


def _status(args: argparse.Namespace) -> Outcome:
    from kvmtune.fix.journal import list_journals
    from kvmtune.fix.status import staged
    from kvmtune.runner import default_runner

    root = args.root
    directory = journal_dir(settings_journal_dir(args), root=root)
    found = list_journals(directory, root)
    journals = [j for _id, j, _problem in found if j is not None]
    text = "".join(f"refused: {safe(jid)}: {safe(problem)}\n" for jid, j, problem in found if j is None)
    waiting = staged(journals, default_runner(), HostRoot(root))
    if args.format == "json":
        doc = {"staged": [{"journal": s.journal, "change": s.n, "what": s.what, "takes_effect": s.takes_effect,
                           "why": s.why} for s in waiting],
               "refused": [{"journal": jid, "problem": p} for jid, j, p in found if j is None]}
        return Outcome(result=json.dumps(doc, indent=2) + "\n")
    for s in waiting:
        text += f"{safe(s.journal)} change {s.n}: {safe(s.what)}: staged ({s.takes_effect}): {safe(s.why)}\n"
    text += f"{len(waiting)} change(s) staged in {len(journals)} journal(s) ({safe(str(directory))}).\n"
    return Outcome(result=text)
