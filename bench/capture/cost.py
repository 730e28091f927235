"""What ``kvmtune capture`` costs the guest it records: the probe guest's IOPS with and without a capture running.

Boots the probe guest with ``kvmtune guest run --load disk --job JOB`` and measures, round after round in an order
that alternates, its IOPS over --seconds: without a capture (two ``query-blockstats`` over QMP, nothing else), with
``--source blockstats`` and with ``--source trace`` (the capture's own count). The ratio of each capture round to the
mean of the uncaptured rounds beside it is the cost. Under ``flock /tmp/kvmtune-measure.lock``; under TCG every
figure is an emulation figure. Run: ``python bench/capture/cost.py --rounds 4 --seconds 8``.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from measuring import loadavg, measure_lock, spread
from probe_guest import stop_guest

from kvmtune.qemu.qmp import Qmp

JOB = "rw=randrw rwmixread=70 bs=4k iodepth=8"


def ops(q: Qmp) -> int:
    st = q.execute("query-blockstats")[0]["stats"]
    return int(st["rd_operations"]) + int(st["wr_operations"])


def connect(qmp_path: Path) -> Qmp:
    """QMP takes one client at a time: the capture that just ended may still hold it for a moment."""
    for _ in range(50):
        try:
            return Qmp(qmp_path, timeout=10)
        except BlockingIOError:
            time.sleep(0.2)
    return Qmp(qmp_path, timeout=10)


def uncaptured(qmp_path: Path, seconds: float) -> float:
    q = connect(qmp_path)
    try:
        a, t0 = ops(q), time.monotonic()
        time.sleep(seconds)
        b, t1 = ops(q), time.monotonic()
    finally:
        q.close()
    return (b - a) / (t1 - t0)


def captured(name: str, work: Path, source: str, seconds: float) -> float:
    out = work / f"cost-{source}.json"
    done = subprocess.run([sys.executable, "-m", "kvmtune", "capture", name, "--no-libvirt", "--workdir", str(work),
                           "--seconds", str(seconds), "--source", source, "-o", str(out)],
                          capture_output=True, text=True, timeout=seconds + 60)
    if done.returncode != 0:
        raise SystemExit(f"capture --source {source} failed: {done.stderr.strip()}")
    (disk,) = json.loads(out.read_text())["disks"]
    return float(disk["iops"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--job", default=JOB)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvmtune-capture-cost-"))
    name = f"cost{os.getpid()}"
    guest = subprocess.Popen([sys.executable, "-m", "kvmtune", "guest", "run", "--workdir", str(work), "--load", "disk",
                              "--name", name, "--job", args.job], stdout=subprocess.PIPE, text=True)
    rows: dict[str, list[float]] = {"none": [], "blockstats": [], "trace": []}
    ratios: dict[str, list[float]] = {"blockstats": [], "trace": []}
    try:
        assert guest.stdout is not None
        for line in guest.stdout:
            if "KVMTUNE-JOB-START" in line:
                break
        (qmp_path,) = work.glob(f"run-{name}-*/{name}.qmp")
        time.sleep(3)
        with measure_lock():
            before = loadavg()
            for r in range(args.rounds):
                for source in (("blockstats", "trace") if r % 2 == 0 else ("trace", "blockstats")):
                    base_a = uncaptured(qmp_path, args.seconds)
                    with_capture = captured(name, work, source, args.seconds)
                    base_b = uncaptured(qmp_path, args.seconds)
                    rows["none"] += [base_a, base_b]
                    rows[source].append(with_capture)
                    ratios[source].append(with_capture / ((base_a + base_b) / 2))
                    print(f"round {r + 1} {source:10s} {with_capture:8.0f} IOPS against {base_a:.0f}/{base_b:.0f} "
                          "uncaptured", flush=True)
            after = loadavg()
    finally:
        stop_guest(guest, work)
    print(f"job {args.job!r}, {args.rounds} rounds of {args.seconds:g} s, load average {before} -> {after}, "
          f"{os.cpu_count()} CPUs, TCG (emulation figures)")
    for source, rs in ratios.items():
        print(f"{source:10s} captured/uncaptured IOPS: {spread(rs)}; mean IOPS {statistics.mean(rows[source]):.0f} "
              f"against {statistics.mean(rows['none']):.0f}")


if __name__ == "__main__":
    main()
