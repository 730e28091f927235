"""Snapshot of the whole corpus audit, to prove a speed change changed no finding.

Audits every domain XML and QEMU command line of the libvirt corpus, with the host rules over a
captured fixture host, through ``kvmtune audit`` itself (JSON, SARIF and text reports), and writes the
reports as one file. The only run-dependent field, the JSON report's ``generated`` time, is blanked.

    .venv/bin/python tools/audit_snapshot.py write before.txt      # on the old code
    .venv/bin/python tools/audit_snapshot.py check before.txt      # on the new: exit 1 on any difference
"""

from __future__ import annotations

import difflib
import re
import sys
import tempfile
from contextlib import redirect_stderr
from io import StringIO
from pathlib import Path

from kvmtune.cli import main as kvmtune_main

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "corpus" / "libvirt"
HOST = REPO / "tests" / "fixtures" / "hosts" / "rules-default"
GENERATED = re.compile(r'"generated": "[^"]*"')


def snapshot(corpus: Path) -> str:
    domains = str(corpus / "domains")
    cmdlines = [a for f in sorted((corpus / "args").glob("*.args")) for a in ("--qemu-cmdline", str(f))]
    parts: list[str] = []
    with tempfile.TemporaryDirectory(prefix="kvmtune-snapshot-") as tmp:
        for fmt in ("json", "sarif", "text"):
            out = Path(tmp) / f"report.{fmt}"
            stderr = StringIO()
            with redirect_stderr(stderr):
                code = kvmtune_main(["audit", "--root", str(HOST), "--host", "--format", fmt, "--color", "never",
                                     "-o", str(out), domains, *cmdlines])
            report = GENERATED.sub('"generated": ""', out.read_text(encoding="utf-8"))
            parts.append(f"=== {fmt}: exit {code}\n--- stderr\n{stderr.getvalue()}--- report\n{report}\n")
    return "".join(parts)


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3) or argv[0] not in ("write", "check"):
        print(__doc__, file=sys.stderr)
        return 2
    corpus = Path(argv[2]) if len(argv) == 3 else CORPUS
    now = snapshot(corpus)
    path = Path(argv[1])
    if argv[0] == "write":
        path.write_text(now, encoding="utf-8")
        print(f"{path}: {len(now)} characters")
        return 0
    before = path.read_text(encoding="utf-8")
    if before == now:
        print(f"identical to {path} ({len(now)} characters)")
        return 0
    diff = difflib.unified_diff(before.splitlines(), now.splitlines(), str(path), "now", lineterm="", n=1)
    for n, line in enumerate(diff):
        if n == 40:
            print("...")
            break
        print(line[:300])
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
