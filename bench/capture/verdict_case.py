"""One case where the generic job and the captured workload judge the same fix differently (issue 52,
docs/capture.md "Where the generic job and the captured workload disagree").

The fix: KVM-STO-002 on a definition of the probe guest's disk (``vda``, qcow2, cache=writethrough → cache=none,
aio=native). The guest: fio in the probe guest (TCG) reading a hot set of --hot-mib MiB at random, 4 KiB, depth 4,
with O_DIRECT (a database whose buffer pool is smaller than its working set), its disk capped at --iops; captured
--seconds by trace. Then ``kvmtune verify`` of the definition, once with the rule's generic job (random 4 KiB writes
at depth 16, a flush every 32: IOPS) and once with ``--replay FILE --replay-disk vda`` (``--replay-mode fast`` by
default: IOPS at the captured depth; ``timed``: p99 latency at the guest's own rate; the replicas written whole
first, their page cache dropped), --verifies times each, alternating
generic and replayed; each verify alternates A and B rounds itself (at least --repeat a side, more until the verdict
settles or --finding-budget runs out).

Holds the measuring lock (/tmp/kvmtune-measure.lock) for the whole run, so run it plain:
``python bench/capture/verdict_case.py``. Prints the CPU count, the load average before and after, and that nothing is
pinned. The capture is a TCG emulation figure; the verify rounds run on the host's block tier.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from measuring import loadavg, measure_lock
from probe_guest import capture_by_trace, kvmtune, scratch

PREFIX = "kvmtune-verdict-case-"  # its scratch: the definition and the workload file; removed at the end
XML = Path(__file__).resolve().parents[2] / "tests" / "rules" / "KVM-STO-002" / "bad" / "writethrough.xml"


def verify(definition: Path, workload: Path | None, args: argparse.Namespace) -> dict[str, Any]:
    extra = ["--replay", str(workload), "--replay-disk", "vda", "--replay-mode", args.replay_mode] if workload else []
    res = kvmtune("verify", str(definition), "--only", "KVM-STO-002", "--repeat", str(args.repeat), "--seconds",
                  str(args.verify_seconds), "--finding-budget", str(args.finding_budget), "--no-store", "--format", "json",
                  *extra)
    try:
        (r,) = [r for r in json.loads(res.stdout)["results"] if r["rule"] == "KVM-STO-002"]
    except (ValueError, KeyError) as exc:
        raise SystemExit(f"verify failed ({exc}): {res.stderr.strip()[-400:]}") from None
    m = r["measurement"] or {}
    iv = m.get("interval_95")
    print(f"  {'replayed' if workload else 'generic '}: {r['verdict']}: {m.get('metric')} {m.get('before')} -> "
          f"{m.get('after')} ({m.get('unit')}), ratio {m.get('ratio')} {iv} after {m.get('n')} rounds a side"
          f"{'' if not r['error'] else ' error ' + str(r['error'])}", flush=True)
    return {"verdict": r["verdict"], "measurement": m, "workload": r["workload"], "replay": r["replay"],
            "notes": r["notes"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0, help="seconds captured")
    ap.add_argument("--iops", type=int, default=600, help="the guest disk's cap while captured")
    ap.add_argument("--hot-mib", type=int, default=16, help="the guest's hot set")
    ap.add_argument("--verifies", type=int, default=2, help="verify runs a side (generic, replayed, alternating)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--verify-seconds", type=float, default=2.0)
    ap.add_argument("--finding-budget", type=float, default=90.0)
    ap.add_argument("--replay-mode", choices=("timed", "fast"), default="fast",
                    help="timed: p99 latency at the guest's rate; fast: IOPS at its depth (default)")
    args = ap.parse_args()
    with scratch(PREFIX) as tmp:
        measure(args, tmp)


def measure(args: argparse.Namespace, tmp: Path) -> None:
    definition = tmp / "db01.xml"
    definition.write_text(XML.read_text().replace("<target dev='hda' bus='ide'/>", "<target dev='vda' bus='virtio'/>"))
    workload = tmp / "db01.workload.json"
    job = f"rw=randread bs=4k iodepth=4 size={args.hot_mib}m"
    out: dict[str, Any] = {"job": job, "generic": [], "replayed": []}
    with measure_lock():
        before = loadavg()
        disk = capture_by_trace(job, args.iops, "verdict-case", args.seconds, workload)
        out["captured"] = disk
        print(f"captured ({job}, TCG, capped at {args.iops} IOPS): {disk['iops']} IOPS, read fraction "
              f"{disk['read_fraction']}, offset span {disk['offset_span_bytes'] >> 20} MiB, depth mean "
              f"{disk['queue_depth']['mean']}", flush=True)
        for k in range(args.verifies):
            print(f"verify pair {k + 1}", flush=True)
            out["generic"].append(verify(definition, None, args))
            out["replayed"].append(verify(definition, workload, args))
        after = loadavg()
    out["head"] = (f"load average {before} -> {after}, nproc {os.cpu_count()}, not pinned; capture under TCG, "
                   "verify on the host's block tier")
    print(out["head"])
    Path(tempfile.gettempdir(), "kvmtune-verdict-case.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
