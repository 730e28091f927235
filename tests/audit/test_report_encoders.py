"""The reporters' fast paths write exactly what the standard library would: a JSON report's finding line is
``json.dumps(finding.to_json())``, a SARIF document is ``json.dumps(doc, indent=2)``, a text report to a file
is its lines joined again."""

from __future__ import annotations

import dataclasses
import enum
import io
import json
import math
from datetime import date
from pathlib import Path

import pytest

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import AuditResult, run_rules
from kvmtune.audit.finding import Finding, FixHint, Severity, Target, Waiver
from kvmtune.audit.report.json_report import FindingEncoder, write_json
from kvmtune.audit.report.sarif import dumps_indented, render_sarif
from kvmtune.audit.report.text import _other_line_breaks, render_text
from kvmtune.domain.xml import load_guest_file
from kvmtune.host.root import HostRoot

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "src" / "kvmtune" / "examples"


def _result() -> AuditResult:
    guests = [load_guest_file(p) for p in sorted(EXAMPLES.glob("*.xml"))]
    res = AuditResult(guests=guests, looked_at=["4 of 4 domain XML file(s)"])
    res.findings = run_rules(AuditContext(host=HostRoot(str(REPO / "tests/fixtures/hosts/rules-default"))), guests)
    return res


def _base() -> Finding:
    return Finding("KVM-STO-004", "disk-cache-unsafe", "disk-cache", Severity.CRITICAL, "certain",
                   Target("h1", "web01", "disk:vda"), "unsafe", "none", "/domain/devices/disk[1]/driver/@cache",
                   "Disk uses cache='unsafe'", "a host crash loses data", FixHint("xml", "Set cache='none'", True),
                   ("seed:003",), "web01.xml")


def _variants() -> list[Finding]:
    """Findings that share all but one of the pieces the encoder reuses, and the odd values a rule may give."""
    base = _base()
    r = dataclasses.replace
    waiver = Waiver("KVM-STO", "accepted \"risk\"", guest="web*", expires=date(2030, 1, 2), origin="kvmtune.toml:3")
    return [
        base, base,
        r(base, severity=Severity.LOW), r(base, confidence="possible"), r(base, rule="KVM-STO-005"),
        r(base, target=Target("h1", "web01", "disk:vdb")), r(base, target=Target("h1", None, None)),
        r(base, fix=FixHint("xml", "Set cache='none'", False)), r(base, fix=FixHint("manual", "", True)),
        r(base, references=()), r(base, references=("a", "b")), r(base, why="another reason"),
        r(base, actual="caf\u00e9 \u2028 \x1b[2J \"quoted\" \\ tab\t", summary="\ud83d\ude00 emoji"),
        r(base, source=""), r(base, extra={"guessed": "windows", "n": 3, "ratio": 0.5, "list": [1, None, True]}),
        r(base, waiver=waiver), r(base, new=True), r(base, new=False),
        r(base, actual=4, expected=math.inf),  # not strings, as a careless rule might give them  # type: ignore[arg-type]
    ]


def _expected(f: Finding, uuid: str | None) -> str:
    data = f.to_json()
    if uuid:
        data["target"]["uuid"] = uuid
    return json.dumps(data)


@pytest.mark.parametrize("uuid", [None, "", "1b4e28ba-2fa1-11d2-883f-b9a761bde3fb"])
def test_a_finding_line_is_json_dumps_of_its_to_json(uuid: str | None) -> None:
    encoder = FindingEncoder()
    findings = _variants() + _result().findings
    for f in findings + findings:  # the second time every piece comes from what was written before
        assert encoder.encode(f, uuid) == _expected(f, uuid)
    for other in ("another-uuid", None):  # one target, another guest's UUID
        assert encoder.encode(findings[0], other) == _expected(findings[0], other)


def test_the_encoder_forgets_pieces_past_its_bound_and_still_writes_them_right(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(FindingEncoder, "KEEP", 5)
    encoder = FindingEncoder()
    findings = _variants() + _result().findings
    for f in findings + findings:
        assert encoder.encode(f, "u") == _expected(f, "u")
        kept = vars(encoder)
        assert sum(len(kept[k]) for k in ("_escaped", "_targets", "_tails")) <= 5 + 7  # one finding adds at most 7


def test_a_json_report_holds_each_finding_as_json_dumps_writes_it() -> None:
    res = _result()
    res.findings += _variants()
    buf = io.StringIO()
    write_json(res, buf)
    text = buf.getvalue()
    doc = json.loads(text)
    uuids = {g.name: (g.uuid or "").lower() for g in res.guests}
    lines = [line.strip().rstrip(",") for line in text.splitlines() if line.startswith("    {\"rule\": ")]
    assert lines == [_expected(f, uuids.get(f.target.domain or "")) for f in res.findings]
    assert len(doc["findings"]) == len(res.findings)


class _Level(enum.IntEnum):
    HIGH = 3


@pytest.mark.parametrize("obj", [
    {}, [], (), "plain", "caf\u00e9\n\u2028", 0, -7, 2**70, 1.5, -0.0, 1e300, math.nan, -math.inf, None, True, False,
    _Level.HIGH, {"a": [], "b": {}, "c": [{}], "d": [[]]}, [1, [2, [3, [4]]]], (1, ("x", None)),
    {1: "int key", 2.5: "float key", None: "none key", "s": "str key"}, {True: "bool key", False: 0},
    {"nested": {"deeper": {"list": [{"k": "v", "n": 1}, "s", 2.25, False]}}, "empty": ""},
])
def test_dumps_indented_is_json_dumps_indent_2(obj: object) -> None:
    assert dumps_indented(obj) == json.dumps(obj, indent=2)


@pytest.mark.parametrize("obj", [{"a": object()}, [set()], {(1, 2): "tuple key"}, b"bytes"])
def test_dumps_indented_refuses_what_json_dumps_refuses(obj: object) -> None:
    with pytest.raises(TypeError):
        json.dumps(obj, indent=2)
    with pytest.raises(TypeError):
        dumps_indented(obj)


def test_a_sarif_report_is_its_document_indented_by_json_dumps() -> None:
    res = _result()
    res.findings += _variants()[:-1]  # the last one's infinity is no valid JSON to read back
    out = render_sarif(res)
    doc = json.loads(out)
    assert len(doc["runs"][0]["results"]) == len(res.findings)
    assert out == json.dumps(doc, indent=2) + "\n"


def test_a_text_report_to_a_file_is_its_lines_joined_again() -> None:
    res = _result()
    res.findings += _variants()
    out = render_text(res)
    assert "\\x1b[2J" in out and "\x1b" not in out  # still made safe, each value once
    assert out == "\n".join(out.splitlines()) + "\n"
    assert render_text(res, width=10_000) == out  # the path that splits and wraps each line


@pytest.mark.parametrize("breaker", ["\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"])
@pytest.mark.parametrize("rest", ["ascii text", "caf\u00e9"])
def test_every_line_break_splitlines_knows_is_seen(breaker: str, rest: str) -> None:
    assert len(f"a{breaker}b".splitlines()) == 2
    assert _other_line_breaks(f"{rest}\n{rest}{breaker}x\n")
    assert not _other_line_breaks(f"{rest}\n{rest}\n")
