"""``kvmtune audit``: domain XML, libvirt, QEMU command lines (and the host)."""

from __future__ import annotations

import argparse
import sys
from datetime import date
from pathlib import Path
from typing import Any, TextIO

from kvmtune.audit.collect import (
    DEFAULT_URI,
    Sources,
    domain_files_among_images,
    gather,
    kubevirt_paths,
    pve_config_paths,
)
from kvmtune.audit.collect_agent import DEFAULT_TIMEOUT_S as DEFAULT_AGENT_TIMEOUT_S
from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import AuditResult, run_rules, select_rules
from kvmtune.audit.finding import Severity
from kvmtune.audit.incus_advice import incus_fix_texts
from kvmtune.audit.kubevirt_advice import kubevirt_fix_texts
from kvmtune.audit.kubevirt_running import kubevirt_running_texts
from kvmtune.audit.pve_advice import pve_fix_texts
from kvmtune.audit.report import FORMATS, render
from kvmtune.audit.report.json_report import write_json
from kvmtune.audit.settings import Settings
from kvmtune.audit.waivers import Baseline, apply_baseline, apply_waivers, counted, guest_waivers, read_baseline
from kvmtune.cli import audit_host
from kvmtune.cli.command import (
    Command,
    Exit,
    Outcome,
    color_option,
    db_option,
    format_option,
    journal_dir_option,
    output_option,
    results_db,
    root_option,
    settings_journal_dir,
    settings_of,
)
from kvmtune.errors import UsageError
from kvmtune.host.root import HostRoot
from kvmtune.lab.accel_cache import verdict_for
from kvmtune.qemu.argv import DEFAULT_BINARY, is_qemu_binary


class AuditCommand(Command):
    name = "audit"
    help = "audit libvirt domains, QEMU command lines and the host"
    description = "Audit KVM guests against today's best practice. With no input, audits what this host runs."
    uses_settings = True

    def options(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("paths", nargs="*", metavar="PATH",
                       help="domain XML files, Proxmox VE VM configs (<vmid>.conf) or directories of them")
        p.add_argument("--pve-storage", metavar="FILE", default=None,
                       help="the Proxmox VE storage.cfg that named .conf files' storage IDs resolve through "
                       "(default: /etc/pve/storage.cfg of the audited host)")
        p.add_argument("-c", "--connect", action="append", default=[], metavar="URI",
                       help="libvirt URI whose domains to audit (repeatable), e.g. qemu:///system, qemu+ssh://host/system")
        p.add_argument("--domain", action="append", default=[], metavar="NAME",
                       help="only the libvirt domains of this name or UUID (repeatable, shell globs: 'web*'); "
                       f"without --connect, those of {DEFAULT_URI}")
        p.add_argument("--qemu-cmdline", action="append", default=[], metavar="FILE",
                       help="a file holding one QEMU command line (repeatable)")
        p.add_argument("--qemu-binary", default=DEFAULT_BINARY, metavar="NAME", type=_qemu_binary,
                       help="whose argument list a --qemu-cmdline file starting with an option is (the binary "
                       f"logged apart, as Packer, Multipass and Kata do; default {DEFAULT_BINARY})")
        p.add_argument("--template", action="store_true",
                       help="audit templates (placeholders such as {{ x }}, ${X}, %%(x)s, @X@ in values the rules "
                       "judge) with those values not stated, instead of refusing them")
        p.add_argument("--recursive", action="store_true",
                       help="read a directory of KubeVirt manifests as a tree (a GitOps repository), not one level")
        p.add_argument("--kubevirt", nargs="?", const="", default=None, metavar="CONTEXT",
                       help="read KubeVirt VMs, VMIs, pools, instancetypes and preferences from a cluster with "
                       "'kubectl get', and each running VMI's domain XML with 'kubectl exec … virsh dumpxml' "
                       "(read-only; CONTEXT: a kubeconfig context, default the current one)")
        p.add_argument("--running", action="store_true", help="audit every running qemu-system-* process")
        p.add_argument("--assume-this-host", action="store_true",
                       help="treat guests read from files as guests of this host: compare their vCPUs with this "
                       "host's CPUs and probe their local disk images")
        root_option(p)
        p.add_argument("--examples", action="store_true", help="audit the example domains shipped with kvmtune")
        format_option(p, FORMATS)
        output_option(p)
        p.add_argument("--also", action="append", default=[], metavar="FORMAT=FILE", type=_also,
                       help="also write this same audit as FORMAT to FILE (atomically; repeatable): one audit, "
                            "several outputs, e.g. --format json -o audit.json --also prometheus=kvmtune.prom")
        p.add_argument("--fail-on", metavar="SEVERITY", default=None,
                       help="exit 1 if any finding is at or above SEVERITY (info|low|medium|high|critical)")
        p.add_argument("--only", default=None, metavar="RULES", help="comma-separated rule ids, slugs or prefixes")
        p.add_argument("--skip", default=None, metavar="RULES", help="comma-separated rule ids, slugs or prefixes")
        waived = p.add_mutually_exclusive_group()
        waived.add_argument("--show-waived", action="store_true",
                            help="show waived findings in full, with the waiver that accepted each")
        waived.add_argument("--no-waivers", action="store_true",
                            help="apply no waiver (settings file or domain <metadata>): every finding counts")
        p.add_argument("--new-since", metavar="REPORT", default=None,
                       help="an earlier 'audit --format json' report, or db:LABEL (the newest fleet collection of that "
                       "name in the results database): --fail-on counts only findings new since it; resolved ones are "
                       "listed")
        db_option(p)
        color_option(p)
        p.add_argument("--agent-timeout", type=_seconds, default=None, metavar="SECONDS",
                       help="how long each running guest's QEMU guest agent may take to tell its inside "
                       f"(default {DEFAULT_AGENT_TIMEOUT_S:g})")
        p.add_argument("--no-agent", action="store_true",
                       help="do not ask running guests' guest agents about their inside")
        from kvmtune.fix.journal import DEFAULT_DIR, ENV_DIR

        p.add_argument("--staged", action="store_true",
                       help="JSON: add 'staged', how many changes 'kvmtune fix' journaled on this host are not in force "
                       "yet (what 'kvmtune fix --status' lists), for the fleet report's staged count per host")
        journal_dir_option(p, DEFAULT_DIR, ENV_DIR)
        audit_host.add_options(p)

    def check(self, args: argparse.Namespace) -> None:
        _fail_on(args, settings_of(args))

    def run(self, args: argparse.Namespace) -> Outcome:
        settings = settings_of(args)
        fail_on = _fail_on(args, settings)
        rules = select_rules(_rule_keys(args.only, settings, "only"), _rule_keys(args.skip, settings, "skip"))
        baseline = read_baseline(args.new_since) if args.new_since and not args.new_since.startswith("db:") else None
        paths, images, moved = domain_files_among_images(args.paths, args.images)
        paths, confs = pve_config_paths(paths)
        paths, manifests = kubevirt_paths(paths, args.recursive)
        connect = tuple(args.connect or ([DEFAULT_URI] if args.domain else []))
        named = bool(paths or confs or manifests or images or connect or args.qemu_cmdline or args.running or args.examples
                     or args.kubevirt is not None)
        if not (named or args.host):
            connect = tuple(settings.get("connect"))  # the settings' URIs stand in for "what this host runs"
        timeout = args.agent_timeout if args.agent_timeout is not None else float(settings.get("agent_timeout"))
        sources = Sources(
            paths=tuple(paths), connect=connect, domains=tuple(args.domain), qemu_cmdline=tuple(args.qemu_cmdline),
            qemu_binary=args.qemu_binary, template=args.template,
            running=args.running, pve_configs=tuple(confs), pve_storage=args.pve_storage,
            kubevirt=tuple(manifests), recursive=args.recursive, kubevirt_context=args.kubevirt,
            examples=args.examples, host=args.host, images=tuple(images), guest_images=not args.no_images,
            assume_this_host=args.assume_this_host, agent_timeout=None if args.no_agent else timeout,
        )
        ctx = AuditContext(host=(host := HostRoot(args.root)), accel_verdict=verdict_for(host),
                           thresholds=settings.thresholds)
        result = gather(sources, ctx)
        result.host = ctx.host_label()
        guests_named = named or bool(connect)
        result.scope = [name for name, on in (("host", sources.host or not sources.explicit),
                                              ("guests", guests_named or not sources.explicit)) if on]
        result.looked_at.extend(f"{m}: named after --images but a .xml file, audited as a domain" for m in moved)
        result.findings = run_rules(ctx, result.guests, result.images, result.host_audited, rules)
        pve_fix_texts(result.findings, result.guests, ctx, rules)
        incus_fix_texts(result.findings, result.guests)
        kubevirt_fix_texts(result.findings, result.guests)
        kubevirt_running_texts(result.findings, result.guests)
        from kvmtune.fix.effect import annotate

        annotate(result.findings, result.guests)
        result.errors.extend(ctx.errors)
        if not args.no_waivers:
            ignored: list[str] = []
            waivers = [*settings.waivers, *guest_waivers(result.guests, result.errors, ignored)]
            notes = apply_waivers(result.findings, waivers, result.guests, today=date.today(), host=result.host,
                                  rule_ids=[r.id for r in rules])
            result.waiver_notes = [*ignored, *notes.lines()]
        result.show_waived = args.show_waived
        if args.staged:
            result.staged = _staged(args)
        if args.new_since and baseline is None:  # db:LABEL: this host's part of a fleet collection
            baseline = _fleet_baseline(args, ctx.host_label())
        if baseline is not None:
            result.baseline = baseline.source
            result.resolved = apply_baseline(result.findings, baseline, result.guests)
        audited = bool(result.guests or result.images or result.host_audited)
        # Text mode: an input error is one line on stderr, not also in the report; a run in which every
        # input failed prints no report at all. JSON and SARIF keep the errors inside the document.
        shown = args.format != "text" or audited or args.output is not None
        if result.errors:
            code = Exit.USAGE
        elif fail_on is not None and any(f.severity >= fail_on for f in counted(result.findings)):
            code = Exit.FINDINGS
        else:
            code = Exit.OK
        # text shows the waiver notes in the report; the other formats carry them and say them on stderr too
        said = result.waiver_notes if args.format != "text" or not shown else []
        return Outcome(code, result if shown else None, [*result.errors, *said])

    def render(self, outcome: Outcome, fmt: str, out: TextIO, *, color: bool) -> None:
        result = outcome.result
        assert isinstance(result, AuditResult)
        if fmt == "json":  # streamed: thousands of domains never sit in memory twice
            write_json(result, out)
            return
        from kvmtune.cli import terminal_width

        out.write(render(result, fmt, color=color, width=terminal_width() if out is sys.stdout else None))


COMMANDS = (AuditCommand,)


def _also(text: str) -> tuple[str, Path]:
    """``--also FORMAT=FILE``: another rendering of the same audit (the audit service writes JSON and Prometheus
    text from one audit, so they describe the same moment)."""
    fmt, sep, path = text.partition("=")
    if not sep or fmt not in FORMATS or not path or path == "-":
        raise argparse.ArgumentTypeError(f"{text!r}: expected FORMAT=FILE, FORMAT one of {', '.join(FORMATS)}")
    return fmt, Path(path)


def _fail_on(args: argparse.Namespace, settings: Settings) -> Severity | None:
    text = args.fail_on if args.fail_on is not None else settings.get("fail_on")
    try:
        return Severity.parse(text) if text else None
    except ValueError as exc:
        raise UsageError(f"--fail-on: {exc}") from None


def _rule_keys(given: str | None, settings: Settings, name: str) -> list[str]:
    """``--only``/``--skip`` as given, else the settings file's list."""
    return _split(given) if given is not None else list(settings.get(name))


def _fleet_baseline(args: argparse.Namespace, host: str) -> Baseline:
    """``--new-since db:LABEL``: this host's findings in the newest fleet collection of that name (the fleet knows a
    host by its inventory name, which must be this audit's host name)."""
    spec = str(args.new_since)
    label, db = spec[3:], results_db(args)
    if not label:
        raise UsageError("--new-since db:LABEL: name the fleet collection")
    if not db.is_file():
        raise UsageError(f"--new-since {spec}: no results database {db}")
    from kvmtune.fleet.history import History

    with History(db) as hist:
        found = hist.newest(label)
    if found is None:
        raise UsageError(f"--new-since {spec}: no fleet collection named {label!r} in {db}")
    if host not in found.hosts:
        raise UsageError(f"--new-since {spec}: fleet collection {found.id} has no host {host!r}")
    entries: list[dict[str, Any]] = [
        {"rule": f.rule, "target": {"host": f.host, "domain": f.domain or None, "device": f.device or None,
                                    "uuid": f.uuid or None}, "summary": f.summary}
        for f in found.findings if f.host == host
    ]
    return Baseline(f"fleet collection {label} ({found.id}), host {host}", entries, any_host=True)


def _qemu_binary(text: str) -> str:
    if not is_qemu_binary(text) or any(c.isspace() or not c.isprintable() for c in text):
        raise argparse.ArgumentTypeError(f"{text!r}: not a QEMU system emulator (qemu-system-ARCH, qemu-kvm, kvm)")
    return text


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 600:
        raise argparse.ArgumentTypeError(f"{text}: give between 0 and 600 seconds")
    return value


def _split(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _staged(args: argparse.Namespace) -> dict[str, Any]:
    """``--staged``: this host's journals read back as ``fix --status`` does, counted (fix/status.summary)."""
    from kvmtune.fix.journal import journal_dir, list_journals
    from kvmtune.fix.status import summary
    from kvmtune.runner import default_runner

    found = list_journals(journal_dir(settings_journal_dir(args), root=args.root), args.root)
    journals = [j for _id, j, _problem in found if j is not None]
    return summary(journals, len(found) - len(journals), default_runner(), HostRoot(args.root))
