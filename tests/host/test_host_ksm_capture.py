"""The KSM advisor (``host/ksm.py``) and the capture writer (``host/capture.py``) live in the host layer:
what they need from above it (the running-guest finder, the audit's findings, the command-line redactor)
is passed in by the command (issue 30)."""

from __future__ import annotations

import json
from pathlib import Path

from kvmtune.host.capture import RecordingHostRoot, write_capture
from kvmtune.host.facts import HostFacts
from kvmtune.host.ksm import build_report
from kvmtune.host.root import HostRoot
from kvmtune.model.guest import Guest
from kvmtune.qemu.process import running_qemu_guests

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
TREE = HOSTS / "ksm-overcommit"


def test_the_advisor_counts_the_guests_its_finder_returns() -> None:
    real = build_report(HostFacts(HostRoot(str(TREE)), guests=running_qemu_guests))
    assert real.guests == 12 and real.memory_ratio is not None and real.memory_ratio > 1.0

    def two_small(_host: HostRoot) -> tuple[list[Guest], list[str]]:
        return [Guest(name=n, origin="test", origin_kind="cmdline", memory_kib=1 << 20) for n in "ab"], []

    rep = build_report(HostFacts(HostRoot(str(TREE)), guests=two_small))
    assert rep.guests == 2 and rep.guest_memory_kib == 2 << 20
    assert rep.sharing_ratio == real.sharing_ratio  # the counters are the tree's either way
    assert any("fits without KSM" in a for a in rep.advice) and not any("fits without KSM" in a for a in real.advice)


def test_write_capture_writes_what_was_read_below_dest_through_the_given_redactor(tmp_path: Path) -> None:
    rec = RecordingHostRoot(str(TREE))
    facts = HostFacts(rec, probe=False, guests=running_qemu_guests)
    facts.load_all()
    seen: list[bytes] = []

    def redact(data: bytes) -> tuple[bytes, int]:
        seen.append(data)
        return b"qemu-system-x86_64\0-name\0redacted\0", 1

    dest = tmp_path / "cap"
    dest.mkdir()
    manifest = write_capture(rec, facts, dest, findings=["KVM-HST-006", "KVM-HST-006"], redact=redact)
    assert manifest["redacted_values"] == len(seen) == len(manifest["qemu_processes"]) == 12
    assert manifest["findings_at_capture"] == ["KVM-HST-006"]
    assert manifest["source_root"] == str(TREE)
    assert json.loads((dest / "CAPTURE.json").read_text()) == manifest
    assert (dest / "proc" / "5200" / "cmdline").read_bytes() == b"qemu-system-x86_64\0-name\0redacted\0"
    assert (dest / "proc" / "meminfo").read_bytes() == (TREE / "proc" / "meminfo").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cap"]  # nothing beside dest
