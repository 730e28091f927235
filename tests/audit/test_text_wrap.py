"""The text report wraps to a terminal's width with a hanging indent; files and pipes keep whole lines."""

from __future__ import annotations

from pathlib import Path

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import AuditResult, run_rules
from kvmtune.audit.report.text import render_text
from kvmtune.domain.xml import load_guest_file
from kvmtune.host.root import HostRoot

EXAMPLES = Path(__file__).resolve().parents[2] / "src" / "kvmtune" / "examples"


def result() -> AuditResult:
    guests = [load_guest_file(p) for p in sorted(EXAMPLES.glob("*.xml"))]
    res = AuditResult(guests=guests, looked_at=["4 of 4 domain XML file(s)"])
    res.findings = run_rules(AuditContext(host=HostRoot(str(EXAMPLES.parents[2] / "tests/fixtures/hosts/rules-default"))),
                             guests)
    return res


def test_wrapped_to_the_width_with_a_hanging_indent() -> None:
    whole = render_text(result()).splitlines()
    assert max(len(line) for line in whole) > 100
    wrapped = render_text(result(), width=80).splitlines()
    assert max(len(line) for line in wrapped) <= 80
    assert len(wrapped) > len(whole)
    for n, line in enumerate(wrapped):
        if line.startswith("             fix: ") and n + 1 < len(wrapped) and wrapped[n + 1].startswith(" " * 18):
            break
    else:
        raise AssertionError("no fix: line continued under its text")
    heads = [n for n, ln in enumerate(wrapped) if ln.startswith("    ") and " KVM-" in ln[:30]]
    continued = [wrapped[n + 1] for n in heads if not wrapped[n + 1].lstrip().startswith("actual:")]
    assert continued and all(c.startswith(" " * 25) for c in continued)  # under the summary, after "MEDIUM   KVM-CPU-001 "
    assert " ".join(" ".join(whole).split()) == " ".join(" ".join(wrapped).split())  # same words


def test_color_survives_wrapping() -> None:
    colored = render_text(result(), color=True, width=80)
    assert "\033[1;31mHIGH    \033[0m KVM-" in colored
