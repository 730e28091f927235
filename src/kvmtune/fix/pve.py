"""Fixing Proxmox VE guests: the ``qm set`` changes of their findings, as an edit of the VM config file.

In a captured tree (``fix --root TREE``, PVE not running there) the ``.conf`` file is rewritten atomically
through the journal (a :class:`PveConfEdit`, a :class:`FileChange`), so ``undo`` puts back its bytes. Each
change also names the ``qm set`` line that makes it on a running node, where PVE validates it, takes its
config lock and keeps it as pending until the VM's next start.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.audit.rule import Rule
from kvmtune.fix.diff import Reason
from kvmtune.fix.files import read_state
from kvmtune.fix.plan import FileChange, Plan
from kvmtune.fix.registry import FixOptions
from kvmtune.host.root import HostRoot
from kvmtune.proxmox.guest import config_of
from kvmtune.proxmox.load import read_host
from kvmtune.proxmox.qmset import QmChange, apply_to_text, change_for, qm_set_line


@dataclass
class PveConfEdit(FileChange):
    """A Proxmox VE VM config rewritten in place (atomically), as ``qm set`` would change it."""

    guest: str = ""

    def title(self) -> str:
        return f"Proxmox VE {self.guest}: rewrite {self.shown}"


def has_pve(root: str) -> bool:
    return HostRoot(root).is_dir("/etc/pve")


def plan_pve(root: str, rules: Sequence[type[Rule]], options: FixOptions, plan: Plan) -> None:
    host = HostRoot(root)
    if host.is_live:
        plan.notes.append("a running Proxmox VE node: make the changes with the 'qm set' lines 'kvmtune audit' prints "
                          "(kvmtune fix edits VM configs only in a captured tree, --root)")
        return
    read = read_host(host)
    plan.skipped.extend(read.errors)
    ctx = AuditContext(host=host)
    for guest in read.guests:
        cfg = config_of(guest)
        if cfg is None:
            continue
        change = QmChange()
        reasons: list[Reason] = []
        for finding in run_rules(ctx, [guest], [], False, rules):
            one = change_for(finding.rule, cfg, finding.target.device)
            if one is None:
                continue
            if one.guest_visible and not options.allow_bus_change:
                plan.skipped.append(f"{guest.name} {finding.target.device or ''}: {finding.rule} changes what the "
                                    "guest sees (--allow-bus-change)")
                continue
            change.merge(one)
            lines = tuple(n for k in [*one.values, *one.props] if (n := cfg.lines.get(k)))
            reasons.append(Reason(f"{finding.rule} {finding.slug}", lines))
        if not (change.values or change.props):
            continue
        path = Path(cfg.path)
        before = read_state(path)
        text = (before.data or b"").decode("utf-8")
        after = apply_to_text(text, cfg, change).encode("utf-8")
        if after == before.data:
            continue
        plan.changes.append(PveConfEdit(path=path, shown=cfg.path, before=before, after=after, reasons=reasons,
                                        guest=guest.name))
        plan.notes.append(f"{guest.name}: on a running node the same change is: {qm_set_line(cfg, change)} "
                          "(pending until the VM's next start)")
