"""Issue 32 item 3: ``kvmtune fix`` does not act on a guessed guest identity unless the rule is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvmtune.audit.rule import all_rules
from kvmtune.fix.domains import fix_guest
from kvmtune.fix.registry import FixOptions

# Windows only by its name: no libosinfo id, no enlightenments, no agent
GUESSED = b"""<domain type='kvm'>
  <name>win10-desk</name>
  <memory unit='GiB'>4</memory>
  <vcpu>2</vcpu>
  <os><type arch='x86_64' machine='pc-q35-8.2'>hvm</type></os>
  <devices><memballoon model='virtio'/></devices>
</domain>
"""
WINDOWS_RULES = [r for r in all_rules() if r.id.startswith("KVM-WIN-")]


def test_a_guessed_windows_guest_gets_no_hyperv_changes() -> None:
    _, result = fix_guest(GUESSED, "win10-desk.xml", "xml", WINDOWS_RULES, FixOptions())
    assert result.after is None  # nothing written
    assert any("KVM-WIN-001" in line and "name the rule (--only KVM-WIN-001)" in line for line in result.skipped), \
        result.skipped


def test_a_named_rule_is_applied_to_a_guessed_guest() -> None:
    _, result = fix_guest(GUESSED, "win10-desk.xml", "xml", WINDOWS_RULES,
                          FixOptions(named_rules=frozenset({"KVM-WIN-001"})))
    assert result.after is not None and b"<hyperv" in result.after
    assert b"hypervclock" not in result.after  # KVM-WIN-002 was not named


def test_the_fix_command_names_a_rule_by_id_not_by_prefix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`kvmtune fix --only KVM-WIN-001` names the rule; `--only KVM-WIN` is a prefix and names none."""
    from kvmtune.cli import main

    dom = tmp_path / "win10-desk.xml"
    dom.write_bytes(GUESSED)
    assert main(["fix", str(dom), "--only", "KVM-WIN"]) == 0
    out = capsys.readouterr().out
    assert "<hyperv" not in out and "name the rule (--only KVM-WIN-001) to apply it" in out
    assert main(["fix", str(dom), "--only", "KVM-WIN-001"]) == 0
    out = capsys.readouterr().out
    assert "+    <hyperv mode='custom'>" in out and "hypervclock" not in out
    assert dom.read_bytes() == GUESSED  # a dry run
