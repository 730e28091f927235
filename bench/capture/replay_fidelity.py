"""Does a timed replay reproduce what was captured? And does the captured workload ever judge a fix differently from
the generic job? (issue 52, docs/capture.md "Fidelity of a replay").

For each pattern: the probe guest under ``kvmtune guest run --load disk --job …`` (TCG), its disk capped at --iops
over QMP as bench/capture/fidelity.py does, captured --seconds by trace; the guest stopped; then on the block tier
(host speed, no guest) ``bench storage --replay FILE`` in timed mode on the probe guest's own disk configuration
(raw, cache=none, aio=threads), --rounds interleaved rounds, the whole log each round; the replay's IOPS against the
captured IOPS. Then ``verify`` of KVM-STO-002 (writethrough → none) on a definition of that disk, once with the rule's
generic job and once with ``--replay FILE`` (timed), and the two verdicts side by side.

Run under the measuring lock: ``flock /tmp/kvmtune-measure.lock python bench/capture/replay_fidelity.py``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from probe_guest import throttled_guest

PATTERNS = [
    ("70/30 random 16 KiB, depth 8", "rw=randrw rwmixread=70 bs=16k iodepth=8"),
    ("random 4 KiB reads, depth 32", "rw=randread bs=4k iodepth=32"),
]
XML = Path(__file__).resolve().parents[2] / "tests" / "rules" / "KVM-STO-002" / "bad" / "writethrough.xml"


def kvmtune(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvmtune", *args], capture_output=True, text=True, timeout=timeout)


def capture(job: str, seconds: float, iops: int, out: Path) -> dict[str, Any]:
    with throttled_guest(job, iops, "replay-fidelity") as (name, work):
        done = kvmtune("capture", name, "--no-libvirt", "--workdir", str(work), "--seconds", str(seconds),
                       "--source", "trace", "-o", str(out), timeout=seconds + 60)
        if done.returncode != 0:
            raise SystemExit(f"capture failed: {done.stderr.strip()}")
    disk: dict[str, Any] = json.loads(out.read_text())["disks"][0]
    return disk


def replay_iops(workload: Path, db: Path, mode: str, rounds: int, seconds: float) -> list[float]:
    res = kvmtune("bench", "storage", "--tier", "block", "--replay", str(workload), "--replay-mode", mode,
                  "--cache", "none", "--aio", "threads", "--db", str(db), "--repeat", str(rounds),
                  "--runtime", str(seconds))
    if "run " not in res.stdout:
        raise SystemExit(f"bench storage --replay failed: {res.stderr.strip()[-400:]}")
    run = res.stdout.split("run ", 1)[1].split(":", 1)[0]
    shown = json.loads(kvmtune("results", "show", run, "--db", str(db), "--format", "json").stdout)
    return [c["metrics"]["iops"] for c in shown["cells"]
            if c["status"] == "ok" and c["config"].get("target") == "file" and c["config"].get("cache") == "none"]


def verdict(definition: Path, workload: Path | None) -> str:
    extra = ["--replay", str(workload), "--replay-disk", "vda"] if workload else []
    res = kvmtune("verify", str(definition), "--only", "KVM-STO-002", "--repeat", "3", "--seconds", "2",
                  "--finding-budget", "30", "--no-store", *extra)
    return next((ln for ln in res.stdout.splitlines() if ln.startswith("KVM-STO-002")), res.stderr.strip()[-300:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0, help="seconds captured")
    ap.add_argument("--iops", type=int, default=600, help="the guest disk's cap while captured")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kvmtune-replay-fidelity-out-"))
    definition = tmp / "web01.xml"
    definition.write_text(XML.read_text().replace("<target dev='hda' bus='ide'/>", "<target dev='vda' bus='virtio'/>"))
    out: list[dict[str, Any]] = []
    for i, (title, job) in enumerate(PATTERNS):
        workload = tmp / f"w{i}.json"
        disk = capture(job, args.seconds, args.iops, workload)
        timed = replay_iops(workload, tmp / "r.db", "timed", args.rounds, args.seconds + 2)
        med = statistics.median(timed) if timed else float("nan")
        ratio = med / disk["iops"] if disk["iops"] else float("nan")
        print(f"\n{title} ({job}): captured {disk['iops']:.0f} IOPS by trace ({disk['seconds']:.1f} s, depth mean "
              f"{disk['queue_depth']['mean']}, p95 {disk['queue_depth']['p95']})", flush=True)
        print(f"  timed replay, raw/none/threads, {len(timed)} rounds: {', '.join(f'{v:.0f}' for v in timed)} IOPS; "
              f"median {med:.0f} = {ratio:.1%} of captured ({'within' if abs(ratio - 1) <= 0.15 else 'outside'} 15 %)",
              flush=True)
        generic, replayed = verdict(definition, None), verdict(definition, workload)
        print(f"  verify, generic job:  {generic}\n  verify, replayed:     {replayed}", flush=True)
        out.append({"pattern": title, "job": job, "captured": disk, "timed_replay_iops": timed, "ratio": ratio,
                    "verify_generic": generic, "verify_replayed": replayed})
    Path(tempfile.gettempdir(), "kvmtune-replay-fidelity.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
