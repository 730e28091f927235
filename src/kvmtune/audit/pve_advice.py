"""Findings on a Proxmox VE guest carry their fix as ``qm set`` (and the web UI field), not as domain XML.

The rule's description is its libvirt form; its ``pve`` attribute (a :class:`kvmtune.proxmox.qmset.PveForm`)
is the PVE form of the same fix. A finding whose rule has no PVE form keeps its text, prefixed with what a PVE operator edits.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvmtune.audit.finding import Finding, FixHint
from kvmtune.audit.rule import rule_by_id
from kvmtune.model.guest import Guest
from kvmtune.proxmox.guest import config_of
from kvmtune.proxmox.qmset import change_for, qm_set_line


def pve_fix_texts(findings: Iterable[Finding], guests: Iterable[Guest]) -> None:
    configs = {g.name: cfg for g in guests if g.origin_kind == "pve" and (cfg := config_of(g)) is not None}
    if not configs:
        return
    for finding in findings:
        cfg = configs.get(finding.target.domain or "")
        if cfg is None:
            continue
        rule = rule_by_id(finding.rule)
        change = change_for(rule.pve if rule else None, cfg, finding.target.device)
        if change is None:
            if finding.fix.kind == "xml":
                finding.fix = FixHint("manual", "In this VM's Proxmox VE config (qm set or the web UI): "
                                      + finding.fix.description, finding.fix.safe)
            continue
        if change.refused:
            finding.fix = FixHint("manual", f"Not with one qm set: {change.refused}; web UI: {change.ui}",
                                  finding.fix.safe)
            continue
        restart = "" if change.moves else " (stored as pending while the VM runs; takes effect at its next start)"
        notes = "".join(f"; {n}" for n in change.notes)
        finding.fix = FixHint(finding.fix.kind, f"{qm_set_line(cfg, change)}{restart}{notes}; web UI: {change.ui}",
                              finding.fix.safe)
