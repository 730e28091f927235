"""How the rule tests read a fixture file as a guest (tests/rules/test_rule_fixtures.py, tests/audit/test_judges_only.py)."""

from __future__ import annotations

import json
from pathlib import Path

from kvmtune.domain.xml import load_guest_file
from kvmtune.guestagent.client import ReplayAgent
from kvmtune.guestagent.inside import read_inside
from kvmtune.model.guest import Guest
from kvmtune.qemu.cmdline import guest_from_text


def case_guest(f: Path) -> Guest | None:
    """A domain XML file (with ``<name>.agent.json`` beside it: the guest running, its inside read from those recorded
    agent answers by the same code as a live agent's) or a QEMU command line (``.args``) as a guest; None for any
    other file."""
    if f.suffix == ".xml":
        guest = load_guest_file(f)
        answers = f.with_suffix(".agent.json")
        if answers.is_file():
            guest.active = True
            guest.inside = read_inside(ReplayAgent(json.loads(answers.read_text())), "recorded answers",
                                       tuple(d.target for d in guest.disks if d.bus == "virtio"))
        return guest
    if f.suffix == ".args":
        return guest_from_text(f.read_text(), str(f))
    return None
