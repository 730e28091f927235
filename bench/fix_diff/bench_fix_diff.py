#!/usr/bin/env python3
"""Scaling of ``kvmtune fix`` (the dry run: plan + diff) against ``kvmtune audit`` on one domain with N disks.

Goal (issue 19): linear; a 10,000-disk domain fixed in under 2x the time its audit takes.
Before the change, ``fix`` was quadratic in ``difflib`` (100 disks 0.37 s, 400 disks 4.0 s,
800 disks 28.7 s, 10,000 disks > 300 s).

    .venv/bin/python bench/fix_diff/bench_fix_diff.py [--sizes 100,400,1000,10000] [--runs 1] [--json out.json]

Each disk has ``cache='writethrough'`` (so every disk gets an edit and a reason); with
``--sparse`` only every tenth disk does (many separate hunks). Times are wall-clock of the
command line as a user runs it (interpreter start and imports included), best of ``--runs``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KVMTUNE = [sys.executable, "-m", "kvmtune"]


def domain(n: int, sparse: bool) -> str:
    disks = []
    for i in range(n):
        cache = "writethrough" if not sparse or i % 10 == 0 else "none' io='native"
        disks.append(
            "    <disk type='file' device='disk'>\n"
            f"      <driver name='qemu' type='raw' cache='{cache}'/>\n"
            f"      <source file='/var/lib/libvirt/images/d{i}.img'/>\n"
            f"      <target dev='vd{i}' bus='virtio'/>\n"
            "    </disk>\n"
        )
    return (
        "<domain type='kvm'>\n"
        f"  <name>many{n}</name>\n  <memory unit='GiB'>4</memory>\n  <vcpu placement='static'>2</vcpu>\n"
        "  <os><type arch='x86_64' machine='pc-q35-8.2'>hvm</type></os>\n  <cpu mode='host-passthrough'/>\n"
        "  <devices>\n    <emulator>/usr/bin/qemu-system-x86_64</emulator>\n"
        + "".join(disks)
        + "  </devices>\n</domain>\n"
    )


def timed(argv: list[str], runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
        best = min(best, time.perf_counter() - t)
        if proc.returncode not in (0, 1):
            raise SystemExit(f"{' '.join(argv[2:])} exited {proc.returncode}: {proc.stderr.decode()[-300:]}")
    return best


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100,200,400,800,2000,5000,10000")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--sparse", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in args.sizes.split(",")):
            path = Path(tmp) / f"many{n}.xml"
            path.write_text(domain(n, args.sparse))
            audit = timed([*KVMTUNE, "audit", str(path)], args.runs)
            fix = timed([*KVMTUNE, "fix", str(path)], args.runs)
            rows.append({"disks": n, "audit_s": round(audit, 3), "fix_s": round(fix, 3), "ratio": round(fix / audit, 2)})
            print(f"{n:>6} disks  audit {audit:6.2f} s  fix {fix:6.2f} s  fix/audit {fix / audit:4.2f}", flush=True)
    last = rows[-1]
    verdict = "met" if last["ratio"] < 2 else "NOT met"
    print(f"goal (fix < 2x audit at {last['disks']} disks): {verdict}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
