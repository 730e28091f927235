"""Does a timed replay reproduce what was captured? (issue 52, docs/capture.md "Fidelity of a replay").

For each pattern, --captures times: the probe guest under ``kvmtune guest run --load disk --job …`` (TCG), its disk
capped at --iops over QMP as bench/capture/fidelity.py does, captured --seconds by trace; the guest stopped; then on
the block tier (host speed, no guest) ``bench storage --replay FILE`` in timed mode on the probe guest's own disk
configuration (raw, cache=none, aio=threads), --rounds rounds, the whole log each round (the replica written whole
first when the log reads). One capture's figure is the median of its replays' IOPS over the captured IOPS; per pattern
the 95 % interval of that ratio over the captures (Student's t on the logarithms) is judged against the issue's
"within 15 %" (0.85-1.15, :func:`kvmtune.lab.vocabulary.within`).

Holds the measuring lock (/tmp/kvmtune-measure.lock) for the whole run, so run it plain (an outer ``flock`` on the same
file would wait on itself): ``python bench/capture/replay_fidelity.py --captures 4``. Prints the CPU count, the load
average before and after, and that nothing is pinned; the captured figures are TCG emulation figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from measuring import loadavg, log_interval, measure_lock
from probe_guest import capture_by_trace, kvmtune, scratch

from kvmtune.lab.vocabulary import within

PREFIX = "kvmtune-replay-fidelity-out-"  # its scratch: the workload files, the run database; removed at the end
PATTERNS = [
    ("70/30 random 16 KiB, depth 8", "rw=randrw rwmixread=70 bs=16k iodepth=8"),
    ("random 4 KiB reads, depth 32", "rw=randread bs=4k iodepth=32"),
]


def replay(workload: Path, db: Path, mode: str, rounds: int, seconds: float) -> list[dict[str, float]]:
    res = kvmtune("bench", "storage", "--tier", "block", "--replay", str(workload), "--replay-mode", mode,
                  "--cache", "none", "--aio", "threads", "--db", str(db), "--repeat", str(rounds),
                  "--runtime", str(seconds))
    if "run " not in res.stdout:
        raise SystemExit(f"bench storage --replay failed: {res.stderr.strip()[-400:]}")
    run = res.stdout.split("run ", 1)[1].split(":", 1)[0]
    shown = json.loads(kvmtune("results", "show", run, "--db", str(db), "--format", "json").stdout)
    return [c["metrics"] for c in shown["cells"]
            if c["status"] == "ok" and c["config"].get("target") == "file" and c["config"].get("cache") == "none"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0, help="seconds captured")
    ap.add_argument("--iops", type=int, default=600, help="the guest disk's cap while captured")
    ap.add_argument("--captures", type=int, default=3, help="captures per pattern")
    ap.add_argument("--rounds", type=int, default=3, help="timed replays per capture")
    ap.add_argument("--only", type=int, help="only this pattern (its index)")
    ap.add_argument("--json", type=Path, help="write every capture and replay's figures here")
    args = ap.parse_args()
    with scratch(PREFIX) as tmp:
        measure(args, tmp)


def measure(args: argparse.Namespace, tmp: Path) -> None:
    out: list[dict[str, Any]] = []
    with measure_lock():
        before = loadavg()
        for i, (title, job) in enumerate(PATTERNS):
            if args.only is not None and i != args.only:
                continue
            ratios: list[float] = []
            for k in range(args.captures):
                workload = tmp / f"w{i}-{k}.json"
                disk = capture_by_trace(job, args.iops, "replay-fidelity", args.seconds, workload)
                cells = replay(workload, tmp / "r.db", "timed", args.rounds, args.seconds + 2)
                timed = [c["iops"] for c in cells]
                med = statistics.median(timed) if timed else float("nan")
                ratio = med / disk["iops"]
                ratios.append(ratio)
                p99 = [round(c.get("clat_p99_us", float("nan"))) for c in cells]
                print(f"{title}, capture {k + 1}: {disk['iops']:.0f} IOPS by trace ({disk['seconds']:.1f} s, depth "
                      f"mean {disk['queue_depth']['mean']}, inter-arrival p50 {disk['inter_arrival_us']['p50']} µs); "
                      f"timed replays {', '.join(f'{v:.0f}' for v in timed)} IOPS (p99 {p99} µs): "
                      f"{ratio:.3f} of captured", flush=True)
                out.append({"pattern": title, "job": job, "captured": disk, "replays": cells, "ratio": ratio})
            centre, interval = log_interval(ratios)
            iv = f"[{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "[no interval]"
            print(f"{title}: replay/captured IOPS {centre:.3f} {iv} over {len(ratios)} captures (min {min(ratios):.3f},"
                  f" max {max(ratios):.3f}); 'within 15 %' {within(interval, 0.85, 1.15)}", flush=True)
        after = loadavg()
    print(f"load average {before} -> {after}, nproc {os.cpu_count()}, not pinned; captures under TCG (emulation "
          "figures), replays on the host's block tier")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
