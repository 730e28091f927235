"""Does ``kvmtune capture`` find what was planted? Four fio patterns in the probe guest, each captured by trace and by
blockstats, the captured figures printed against the planted ones.

Each pattern boots the probe guest (``kvmtune guest run --load disk --job …``), caps its disk at --iops over QMP
(``block_set_io_throttle``: fio's requests then wait in QEMU, where the trace events see them; under TCG, QEMU
otherwise completes each request before the emulated guest submits the next, and the depth at the device is about 1),
and captures --seconds with ``--source trace`` then ``--source blockstats``. Under TCG: the pattern is checked, not
the speed. Run: ``python bench/capture/fidelity.py``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from probe_guest import throttled_guest

# name, fio options, what was planted (read fraction, size in bytes or None for a range, depth, sequential)
PATTERNS: list[tuple[str, str, dict[str, Any]]] = [
    ("random 4 KiB reads, depth 32", "rw=randread bs=4k iodepth=32",
     {"read_fraction": 1.0, "size": 4096, "depth": 32, "sequential": False}),
    ("70/30 random 16 KiB, depth 8, fsync every 16 writes", "rw=randrw rwmixread=70 bs=16k iodepth=8 fsync=16",
     {"read_fraction": 0.7, "size": 16384, "depth": 8, "sequential": False, "flush_per_write": 1 / 16}),
    ("sequential 1 MiB writes", "rw=write bs=1m iodepth=4",
     {"read_fraction": 0.0, "size": 1 << 20, "depth": 4, "sequential": True}),
    ("mixed sizes 4-64 KiB, 50/50 random", "rw=randrw rwmixread=50 bsrange=4k-64k iodepth=4",
     {"read_fraction": 0.5, "size": None, "depth": 4, "sequential": False}),
]


def capture(name: str, work: Path, source: str, seconds: float) -> dict[str, Any]:
    out = work / f"{source}.json"
    done = subprocess.run([sys.executable, "-m", "kvmtune", "capture", name, "--no-libvirt", "--workdir", str(work),
                           "--seconds", str(seconds), "--source", source, "-o", str(out)],
                          capture_output=True, text=True, timeout=seconds + 60)
    if done.returncode != 0:
        return {"error": done.stderr.strip()}
    disk: dict[str, Any] = json.loads(out.read_text())["disks"][0]
    return disk


def run_pattern(job: str, seconds: float, iops: int) -> dict[str, dict[str, Any]]:
    with throttled_guest(job, iops, "capture-fidelity") as (name, work):
        return {source: capture(name, work, source, seconds) for source in ("trace", "blockstats")}


def fmt(v: Any, nd: int = 2) -> str:
    return "-" if v is None else f"{v:.{nd}f}" if isinstance(v, float) else str(v)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--iops", type=int, default=600)
    args = ap.parse_args()
    results = []
    for title, job, planted in PATTERNS:
        got = run_pattern(job, args.seconds, args.iops)
        results.append({"pattern": title, "job": job, "planted": planted, "captured": got})
        print(f"\n{title} ({job}); planted: {planted}")
        for source, d in got.items():
            if "error" in d:
                print(f"  {source:10s} {d['error']}")
                continue
            print(f"  {source:10s} read_fraction {fmt(d['read_fraction'])}  size p50 {fmt(d['size_bytes']['p50'])} "
                  f"mean {fmt(d['size_bytes']['mean'], 0)}  sequential {fmt(d['sequential_fraction'])}  depth mean "
                  f"{fmt(d['queue_depth']['mean'])} p95 {fmt(d['queue_depth']['p95'])}  flush/write "
                  f"{fmt(d['flush_per_write'], 3)}  iops {fmt(d['iops'], 0)}", flush=True)
    Path(tempfile.gettempdir(), "kvmtune-capture-fidelity.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
