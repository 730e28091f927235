"""The audit/parse ratio of ``run.py`` counted in instructions, which no other load on the machine changes.

Runs each side (bare lxml parse of every corpus domain, and the full audit) under valgrind's
cachegrind, once with 0 and once with 2 timed rounds after the same warm-up; the difference,
halved, is the user-space instructions of one warm round. System calls (file reads) are not
counted on either side. Takes a few minutes; needs valgrind.

    .venv/bin/python bench/audit_corpus/instructions.py [CORPUS]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run  # noqa: E402  (the workload is run.py's own: same files, same host fixture)

ROUNDS = 2


def workload(side: str, rounds: int, corpus: Path) -> None:
    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.rule import all_rules
    from kvmtune.host.root import HostRoot

    files = sorted((corpus / "domains").glob("*.xml"))
    ctx = AuditContext(host=HostRoot(str(run.REPO / "tests" / "fixtures" / "hosts" / "rules-default")))
    all_rules()
    run.parse_only(files)  # the same warm-up on both sides
    run.full_audit(files, ctx)
    for _ in range(rounds):
        if side == "parse":
            run.parse_only(files)
        else:
            run.full_audit(files, ctx)


def instructions(side: str, rounds: int, corpus: Path) -> int:
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
           sys.executable, __file__, "--side", side, "--rounds", str(rounds), str(corpus)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    found = re.search(r"I\s+refs:\s+([\d,]+)", out)
    if not found:
        raise SystemExit(f"valgrind printed no instruction count:\n{out[-500:]}")
    return int(found.group(1).replace(",", ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", nargs="?", type=Path, default=run.DEFAULT_CORPUS)
    ap.add_argument("--side", choices=("parse", "audit"), help=argparse.SUPPRESS)  # the measured child
    ap.add_argument("--rounds", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        workload(args.side, args.rounds, args.corpus)
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed", file=sys.stderr)
        return 2
    per_round = {}
    for side in ("parse", "audit"):
        per_round[side] = (instructions(side, ROUNDS, args.corpus) - instructions(side, 0, args.corpus)) / ROUNDS
        print(f"{side:5s}: {per_round[side] / 1e6:7.1f} M instructions per round", flush=True)
    print(f"ratio audit/parse in instructions: {per_round['audit'] / per_round['parse']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
