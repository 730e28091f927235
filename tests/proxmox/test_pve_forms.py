"""One fix-text source per rule (issue 35 item 3): a rule whose fix is a config change declares its Proxmox VE
form (``pve = PveForm(...)``, plain data) beside its libvirt text and XML fixer; ``proxmox/qmset.py`` only
interprets forms and names no rule."""

from __future__ import annotations

from pathlib import Path

import pytest

import kvmtune.proxmox
from kvmtune.audit.rule import Rule, all_rules
from kvmtune.proxmox.config import parse_config
from kvmtune.proxmox.qmset import KINDS, PveForm, change_for, qm_set_line

CONFIG = """\
cores: 4
memory: 8192
name: forms
net0: e1000=BC:24:11:00:00:01,bridge=vmbr0
ostype: l26
scsi0: local-lvm:vm-150-disk-0,cache=writeback,size=32G
scsihw: lsi
sockets: 1
balloon: 0
"""
DEVICE = {"disk-props": "disk:scsi0", "aio": "disk:scsi0", "iothread": "disk:scsi0", "scsihw": "scsi-controller:scsi0",
          "nic-model": "net:bc:24:11:00:00:01", "queues": "net:bc:24:11:00:00:01", "set": ""}
WITH_FORMS = [r for r in all_rules() if r.pve is not None]


def test_the_rules_that_carry_a_pve_form() -> None:
    assert {r.id for r in WITH_FORMS} == {
        "KVM-STO-002", "KVM-STO-003", "KVM-STO-004", "KVM-STO-005", "KVM-STO-006", "KVM-STO-007", "KVM-STO-009",
        "KVM-STO-010", "KVM-STO-012", "KVM-STO-014", "KVM-STO-015", "KVM-NET-001", "KVM-NET-008", "KVM-MEM-002",
        "KVM-CPU-001", "KVM-SEC-001"}


@pytest.mark.parametrize("rule", WITH_FORMS, ids=lambda r: r.id)
def test_each_rules_pve_form_is_a_qm_set_change_with_its_web_ui_field(rule: type[Rule]) -> None:
    form = rule.pve
    assert isinstance(form, PveForm) and form.kind in KINDS
    assert rule.fix_kind != "manual"  # the libvirt form of the same fix exists too
    cfg = parse_config(CONFIG, "150.conf", "150")
    change = change_for(form, cfg, DEVICE[form.kind])
    assert change is not None and (change.values or change.props)
    assert qm_set_line(cfg, change).startswith("qm set 150 --")
    assert change.ui.startswith("Hardware >") and "{}" not in change.ui


def test_proxmox_names_no_rule() -> None:
    package = Path(kvmtune.proxmox.__file__).parent
    assert [p.name for p in package.glob("*.py") if "KVM-" in p.read_text()] == []
