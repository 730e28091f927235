#!/usr/bin/env python3
"""Speed goal of `kvmtune verify` (issue 12): `kvmtune verify --examples` in at most 3 minutes on this machine.

    .venv/bin/python bench/verify/speed.py            # one run, as a user types it
    .venv/bin/python bench/verify/speed.py --runs 2   # more runs (the median is reported)
    .venv/bin/python bench/verify/speed.py --check    # exit 1 when the goal is missed

Runs the real command (real qemu-storage-daemon, fio, scratch replicas in a temporary work
directory, nothing stored) and records the wall time, the time of each experiment, the
verdicts, and the load average before and after: the machine is shared, and other jobs on
the same cores make both the time and the measurement noise larger. Results go to stdout
and to bench/verify/results/latest.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
GOAL_S = 180.0


def one_run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kvmtune-verify-bench-") as work:
        load_before = os.getloadavg()
        start = time.monotonic()
        res = subprocess.run(
            [sys.executable, "-m", "kvmtune", "verify", "--examples", "--no-store", "--workdir", work, "--format", "json"],
            capture_output=True, text=True, check=False,
        )
        took = time.monotonic() - start
        left = sorted(p.name for p in Path(work).iterdir())
    if res.returncode != 0:
        raise SystemExit(f"kvmtune verify --examples exited {res.returncode}: {res.stderr.strip()[-500:]}")
    doc = json.loads(res.stdout)
    measured = [r for r in doc["results"] if r["measurement"]]
    return {
        "wall_s": round(took, 1),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "findings": len(doc["results"]),
        "measured": len(measured),
        "experiments": [
            {"rule": r["rule"], "target": r["target"], "seconds": r["seconds"], "verdict": r["verdict"],
             "ratio": r["measurement"]["ratio"], "interval_95": r["measurement"]["interval_95"]}
            for r in measured
        ],
        "left_in_workdir": left,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--check", action="store_true", help="exit 1 when the median misses the goal")
    ap.add_argument("--json", type=Path, default=HERE / "results" / "latest.json")
    args = ap.parse_args()
    runs = [one_run() for _ in range(args.runs)]
    median = statistics.median(float(r["wall_s"]) for r in runs)
    out = {"goal_s": GOAL_S, "median_wall_s": median, "met": median <= GOAL_S, "cpus": os.cpu_count(),
           "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": runs}
    for n, r in enumerate(runs, 1):
        print(f"run {n}: {r['wall_s']} s, {r['measured']} of {r['findings']} findings measured, "
              f"load {r['load_before'][0]} -> {r['load_after'][0]}")
        for e in r["experiments"]:
            print(f"  {e['rule']} {e['target']}: {e['seconds']} s, {e['verdict']}")
    print(f"kvmtune verify --examples: median {median:.1f} s (goal <= {GOAL_S:.0f} s): {'met' if out['met'] else 'MISSED'}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 1 if args.check and not out["met"] else 0


if __name__ == "__main__":
    sys.exit(main())
