"""Audit speed over libvirt's test corpus, side by side with a bare lxml parse.

Goal (issue 2): auditing every corpus domain costs at most 3x parsing the same files with
lxml alone, and under 2 s on the 2-core development machine. Prints both figures and the
ratio; exits 1 if a goal is missed. Usage: .venv/bin/python bench/audit_corpus/run.py [CORPUS]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from lxml import etree

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.audit.rule import all_rules
from kvmtune.domain.xml import load_guest_file
from kvmtune.errors import InputError
from kvmtune.host.root import HostRoot

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CORPUS = REPO.parent / "shared" / "corpus" / "libvirt"
ROUNDS = 5


def parse_only(files: list[Path]) -> float:
    start = time.perf_counter()
    for f in files:
        try:
            etree.parse(str(f))
        except etree.XMLSyntaxError:
            pass
    return time.perf_counter() - start


def full_audit(files: list[Path], ctx: AuditContext) -> tuple[float, int]:
    start = time.perf_counter()
    findings = 0
    guests = []
    for f in files:
        try:
            guests.append(load_guest_file(f))
        except InputError:
            pass
    findings = len(run_rules(ctx, guests))
    return time.perf_counter() - start, findings


def main() -> int:
    corpus = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_CORPUS
    files = sorted((corpus / "domains").glob("*.xml"))
    ctx = AuditContext(host=HostRoot(str(REPO / "tests" / "fixtures" / "hosts" / "rules-default")))
    all_rules()  # import the rules once, outside the timing, as a CLI run does before reading input
    parse_times, audit_times = [], []
    findings = 0
    for _ in range(ROUNDS):  # interleaved so both see the same machine load
        parse_times.append(parse_only(files))
        t, findings = full_audit(files, ctx)
        audit_times.append(t)
    p, a = statistics.median(parse_times), statistics.median(audit_times)
    ratio = a / p
    print(f"files={len(files)} rules={len(all_rules())} findings={findings}")
    print(f"lxml parse only: median {p * 1000:.0f} ms over {ROUNDS} rounds")
    print(f"full audit:      median {a * 1000:.0f} ms over {ROUNDS} rounds")
    print(f"ratio audit/parse = {ratio:.2f} (goal <= 3.0); audit under 2 s: {a < 2.0}")
    return 0 if ratio <= 3.0 and a < 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
