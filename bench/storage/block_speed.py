#!/usr/bin/env python3
"""Speed goals of `kvmtune bench storage --tier block` (issue 22), measured on this host.

    .venv/bin/python bench/storage/block_speed.py            # the seed-003 preset, 24 cells at 5 s
    .venv/bin/python bench/storage/block_speed.py --check    # exit 1 when a goal is missed

Goals: the seed-003 preset (8 configurations × 3 interleaved rounds = 24 cells, 5 s measured each) takes at
most 150 s of wall time, and the harness adds at most 10 % of the fio runtime per cell (overhead = the time
between two cells' completions minus the cell's ramp and measured seconds: image creation, the storage daemon,
fio's start, deleting the image). Results go to bench/storage/results/block-HOSTFS-latest.json with the load
average,
since other jobs share this machine's cores.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO / "bench" / "storage" / "results"
WALL_GOAL_S, OVERHEAD_GOAL = 150.0, 0.10


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--runtime", type=float, default=5.0)
    ap.add_argument("--host-fs", default="workdir", help="workdir, or a scratch ext4/xfs/btrfs (see the note on discard)")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    from kvmtune.bench.storage.block import RAMP_S
    from kvmtune.bench.store import Store

    with tempfile.TemporaryDirectory(prefix="kvmtune-block-speed-", dir=os.environ.get("KVMTUNE_BENCH_DIR")) as tmp:
        db, wd = Path(tmp) / "r.db", Path(tmp) / "work"
        load_before = os.getloadavg()
        start = time.monotonic()
        res = subprocess.run([sys.executable, "-m", "kvmtune", "bench", "storage", "--tier", "block", "--preset",
                              "seed-003", "--runtime", f"{args.runtime:g}", "--host-fs", args.host_fs, "--db", str(db),
                              "--workdir", str(wd)],
                             capture_output=True, text=True)  # fmt: skip
        wall = time.monotonic() - start
        if res.returncode != 0:
            print(res.stdout + res.stderr, file=sys.stderr)
            return 1
        with Store(db) as st:
            run = st.runs()[0]
            rows = st.db.execute("SELECT started FROM cells WHERE run_id=? ORDER BY id", (run.id,)).fetchall()
            report = subprocess.run([sys.executable, "-m", "kvmtune", "report", str(run.id), "--db", str(db)],
                                    capture_output=True, text=True).stdout  # fmt: skip
        ends = [r[0] for r in rows]
        gaps = [b - a for a, b in itertools.pairwise(ends)]
        overheads = [(g - RAMP_S - args.runtime) / args.runtime for g in gaps]
    out = {
        "cells": len(ends), "wall_s": round(wall, 1), "wall_goal_s": WALL_GOAL_S,
        "overhead_median": round(statistics.median(overheads), 3), "overhead_max": round(max(overheads), 3),
        "overhead_goal": OVERHEAD_GOAL, "runtime_s": args.runtime, "ramp_s": RAMP_S, "host_fs": args.host_fs,
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(), "verdicts": report.strip().splitlines(),
    }  # fmt: skip
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / f"block-{args.host_fs}-latest.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    missed = wall > WALL_GOAL_S or out["overhead_median"] > OVERHEAD_GOAL
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
