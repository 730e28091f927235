"""Findings on a Proxmox VE guest carry their fix as ``qm set`` (and the web UI field), not as domain XML.

The rule's description is its libvirt form; its ``pve`` attribute (a :class:`kvmtune.proxmox.qmset.PveForm`)
is the PVE form of the same fix. A finding whose rule has no PVE form keeps its text, prefixed with what a PVE operator edits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.audit.finding import Finding, FixHint
from kvmtune.audit.rule import Rule, all_rules, rule_by_id
from kvmtune.errors import KvmtuneError
from kvmtune.model.guest import Guest
from kvmtune.proxmox.config import PveConfig
from kvmtune.proxmox.guest import STORAGES, config_of
from kvmtune.proxmox.load import read_config_text
from kvmtune.proxmox.qmset import QmChange, apply_to_text, change_for, drive_refusal, new_values, qm_set_line

# how often a VM's findings are planned again on the changed config (libvirt's fix re-audits the same way)
MAX_ROUNDS = 6

# whether a finding's change is taken: (finding, its change, the config it was made on)
Keep = Callable[[Finding, QmChange, PveConfig], bool]


@dataclass
class Converged:
    change: QmChange  # from the config as it is to one that leaves nothing new to plan: one qm set
    taken: list[tuple[Finding, QmChange, PveConfig]] = field(default_factory=list)
    text: str = ""  # the config after it


def config_text(cfg: PveConfig) -> str:
    """The current section as PVE writes it: enough to read the config again (the file's bytes are fix's)."""
    return "".join(f"{k}: {v}\n" for k, v in cfg.current.items())


def converge(guest: Guest, cfg: PveConfig, text: str, ctx: AuditContext, rules: Sequence[type[Rule]],
             keep: Keep) -> Converged:
    """Plan the findings' changes, apply them to the text, read it again and plan again until a round adds nothing
    (a change can raise a finding of its own: queues= on a NIC, a disk moved to virtio-blk without an IOThread).
    The result is one change made against ``cfg``: what one ``qm set`` gives, never lines that undo each other."""
    forms = {r.id: r.pve for r in rules}
    storages = guest.derived.get(STORAGES)
    flags = ctx.facts.cpu_flags
    out = Converged(QmChange(), text=text)
    now_guest, now_cfg = guest, cfg
    order: list[str] = []  # the keys in the order the rounds changed them: the qm set line keeps it
    for _ in range(MAX_ROUNDS):
        change = QmChange()
        for finding in run_rules(ctx, [now_guest], [], False, rules):
            one = change_for(forms.get(finding.rule), now_cfg, finding.target.device, flags)
            if one is not None and keep(finding, one, now_cfg):
                change.merge(one)
                out.taken.append((finding, one, now_cfg))
        after = apply_to_text(out.text, now_cfg, change) if (change.values or change.props) else out.text
        if after == out.text:
            break
        order.extend(k for k in new_values(now_cfg, change) if k not in order)
        out.change.moves.update(change.moves)
        out.change.notes.extend(n for n in change.notes if n not in out.change.notes)
        out.text = after
        try:
            now_guest, now_cfg, _ = read_config_text(after, f"{cfg.vmid}.conf", storages)
        except KvmtuneError:
            break
        now_cfg.path, now_guest.origin = cfg.path, guest.origin
        now_cfg.node, now_cfg.peers = cfg.node, cfg.peers
        now_guest.on_audited_host, now_guest.images_here = guest.on_audited_host, guest.images_here
    for key in (*order, *cfg.current, *now_cfg.current):
        if cfg.current.get(key) != now_cfg.current.get(key) and key not in out.change.values:
            out.change.values[key] = now_cfg.current.get(key)
    return out


# what a rule citing a domain XPath cites on a PVE guest instead: the config key that holds (or would hold) it
_KEY_OF_XPATH = (
    ("/domain/cpu/numa", "numa"), ("/domain/numatune", "numa"), ("/domain/cputune", "affinity"),
    ("/domain/cpu/topology", "sockets"), ("/domain/cpu", "cpu"), ("/domain/vcpu", "cores"),
    ("/domain/memoryBacking", "hugepages"), ("/domain/currentMemory", "balloon"), ("/domain/memory", "memory"),
    ("/domain/devices/memballoon", "balloon"), ("/domain/devices/rng", "rng0"), ("/domain/os", "machine"),
    ("/domain/clock/@offset", "localtime"), ("/domain/clock", "args"), ("/domain/features", "args"),
    ("/domain/@type", "kvm"),
)
# the QEMU option a fix without a qm set form would take, for the args: line PVE passes on unchecked
ARGS_OF_RULE = {"KVM-NET-021": "-global virtio-net-pci.rx_queue_size=1024"}


def config_evidence(evidence: str, cfg: PveConfig) -> str:
    """A finding's evidence on a PVE guest: config lines (``101.conf:11 cpu`` or ``101.conf (cpu not set)``), never
    the domain XPaths a rule cites on libvirt guests."""
    if "/domain" not in evidence:
        return evidence
    keys: list[str] = []
    for part in evidence.replace(";", ",").split(","):
        part = part.strip()
        if not part.startswith("/domain"):
            continue
        key = next((k for prefix, k in _KEY_OF_XPATH if part.startswith(prefix)), None)
        if key is not None and key not in keys:
            keys.append(key)
    return ", ".join(cfg.where(k) for k in keys) if keys else f"{cfg.path} (PVE's default)"


def _no_form(finding: Finding, cfg: PveConfig) -> FixHint:
    """A fix PVE has no option for: said so, the args: line only as the last resort, marked unsupported."""
    args = ARGS_OF_RULE.get(finding.rule)
    last = (f"qm set {cfg.vmid} --args '{args}'" if args else f"an args: line in {cfg.path}")
    return FixHint("manual", "No qm set or web UI form: Proxmox VE has no option for this. Last resort, unsupported "
                   f"by PVE (it passes args: to QEMU unchecked and may override it): {last}; what it must say: "
                   + finding.fix.description, finding.fix.safe)


def _fixable(finding: Finding, change: QmChange, cfg: PveConfig) -> bool:
    return not change.refused and not drive_refusal(cfg, change)


def pve_fix_texts(findings: Iterable[Finding], guests: Iterable[Guest], ctx: AuditContext | None = None,
                  rules: Sequence[type[Rule]] | None = None) -> None:
    """Each finding's fix as ``qm set``; with ``ctx``, the line of a finding ``fix`` would change is the VM's one
    combined ``qm set`` (what ``fix`` runs), re-planned until nothing new turns up, never one per finding."""
    guests = list(guests)
    configs = {g.name: cfg for g in guests if g.origin_kind == "pve" and (cfg := config_of(g)) is not None}
    if not configs:
        return
    findings = list(findings)
    combined: dict[str, str] = {}
    if ctx is not None:
        chosen = list(rules) if rules is not None else list(all_rules())
        for guest in guests:
            cfg = configs.get(guest.name)
            if cfg is not None and any(f.target.domain == guest.name for f in findings):
                done = converge(guest, cfg, config_text(cfg), ctx, chosen, _fixable)
                if done.change.values:
                    when = "with the VM stopped" if done.change.moves else "pending while the VM runs"
                    combined[guest.name] = (f"{qm_set_line(cfg, done.change)} (this VM's one qm set for every "
                                            f"finding kvmtune fix changes; {when})")
    for finding in findings:
        cfg = configs.get(finding.target.domain or "")
        if cfg is None:
            continue
        rule = rule_by_id(finding.rule)
        change = change_for(rule.pve if rule else None, cfg, finding.target.device,
                            ctx.facts.cpu_flags if ctx is not None else None)
        finding.evidence = config_evidence(finding.evidence, cfg)
        if change is None:
            if finding.fix.kind == "xml":
                finding.fix = _no_form(finding, cfg)
            continue
        if change.refused:
            finding.fix = FixHint("manual", f"Not with one qm set: {change.refused}; web UI: {change.ui}",
                                  finding.fix.safe)
            continue
        restart = "" if change.moves else " (stored as pending while the VM runs; takes effect at its next start)"
        notes = "".join(f"; {n}" for n in change.notes)
        line = combined.get(finding.target.domain or "") or f"{qm_set_line(cfg, change)}{restart}"
        finding.fix = FixHint(finding.fix.kind, f"{line}{notes}; web UI: {change.ui}", finding.fix.safe)
