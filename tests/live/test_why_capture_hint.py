"""``why``'s disk causes suggest ``kvmtune capture`` (optional) where verify measures the fix on the block tier."""

from __future__ import annotations

from kvmtune.audit.rule import all_rules
from kvmtune.audit.verifyplan import BlockExperiment
from kvmtune.live.why.core import capture_hint


def test_a_block_tier_fix_suggests_capturing_first_and_others_do_not() -> None:
    block = [r for r in all_rules() if isinstance(r.verify, BlockExperiment)]
    other = [r for r in all_rules() if not isinstance(r.verify, BlockExperiment)]
    assert block and other
    hint = capture_hint(block[0].id, "web01")
    assert "optional" in hint and "kvmtune capture web01" in hint and f"--only {block[0].id} --replay" in hint
    assert capture_hint(other[0].id, "web01") == "" and capture_hint(None, "web01") == ""
