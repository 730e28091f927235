#!/usr/bin/env python3
"""Speed of the host and image audit.

Targets (issue 3): a full host audit of this machine under 1 s; an image audit
under 100 ms per image plus qemu-img's own time.

    .venv/bin/python bench/audit_host/bench_audit.py [--runs 20] [--json out.json]

Measures
- host, in process: facts read + every host rule, against HostRoot("/") (cold facts each run);
- host, command line: wall time of `kvmtune audit --host` as a user runs it (interpreter start,
  imports, report);
- images: read_image + every image rule per image, split into kvmtune's own time and the time
  spent in qemu-img (from the runner's log).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.audit.rule import HostRule, ImageRule, all_rules
from kvmtune.host.root import HostRoot
from kvmtune.qemu.image import read_image
from kvmtune.runner import Runner

HOST_RULES = [r for r in all_rules() if issubclass(r, HostRule)]
IMAGE_RULES = [r for r in all_rules() if issubclass(r, ImageRule)]


def host_in_process(runs: int) -> dict[str, float]:
    times = []
    findings = 0
    for _ in range(runs):
        t0 = time.perf_counter()
        ctx = AuditContext(host=HostRoot("/"))
        findings = len(run_rules(ctx, audit_host=True, rules=HOST_RULES))
        times.append(time.perf_counter() - t0)
    return {"median_ms": statistics.median(times) * 1e3, "max_ms": max(times) * 1e3, "findings": findings,
            "files_read": len(ctx.host.reads)}


def host_cli(runs: int) -> dict[str, float]:
    exe = Path(sys.executable).with_name("kvmtune")
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "kvmtune"]
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([*argv, "audit", "--host"], capture_output=True, check=False)
        times.append(time.perf_counter() - t0)
    return {"median_ms": statistics.median(times) * 1e3, "max_ms": max(times) * 1e3}


def make_images(d: Path) -> list[Path]:
    def qi(*a: str) -> None:
        subprocess.run(["qemu-img", *a], check=True, capture_output=True)

    raw = d / "mbr63.raw"
    qi("create", "-q", "-f", "raw", str(raw), "1G")
    subprocess.run(["sfdisk", "-q", "--no-reread", "--no-tell-kernel", str(raw)],
                   input=b"label: dos\nstart=63, size=1000000, type=83\n", check=True, capture_output=True)
    qi("convert", "-O", "qcow2", str(raw), str(d / "mbr63.qcow2"))
    qi("convert", "-c", "-O", "qcow2", str(raw), str(d / "compressed.qcow2"))
    qi("create", "-q", "-f", "qcow2", "-o", "preallocation=metadata", str(d / "meta-20g.qcow2"), "20G")
    qi("create", "-q", "-f", "qcow2", str(d / "big-2t.qcow2"), "2T")
    qi("create", "-q", "-f", "qcow2", "-b", "mbr63.qcow2", "-F", "qcow2", str(d / "overlay.qcow2"))
    return [raw, d / "mbr63.qcow2", d / "compressed.qcow2", d / "meta-20g.qcow2", d / "big-2t.qcow2",
            d / "overlay.qcow2"]


def images(runs: int) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="kvmtune-bench-") as tmp:
        for path in make_images(Path(tmp)):
            own, qemu = [], []
            for _ in range(runs):
                runner = Runner()
                ctx = AuditContext(host=HostRoot("/"), runner=runner)
                t0 = time.perf_counter()
                img = read_image(str(path), runner, [])
                run_rules(ctx, images=[img], rules=IMAGE_RULES)
                total = time.perf_counter() - t0
                q = sum(r.duration_s for r in runner.history)
                own.append(total - q)
                qemu.append(q)
            out.append({"image": path.name, "own_median_ms": statistics.median(own) * 1e3,
                        "own_max_ms": max(own) * 1e3, "qemu_img_median_ms": statistics.median(qemu) * 1e3})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    res = {"host_in_process": host_in_process(args.runs), "host_cli": host_cli(max(3, args.runs // 2)),
           "images": images(max(3, args.runs // 2))}
    h, c = res["host_in_process"], res["host_cli"]
    print(f"host audit, in process : median {h['median_ms']:.1f} ms, max {h['max_ms']:.1f} ms "
          f"({h['files_read']} files read, {h['findings']} findings)   target < 1000 ms")
    print(f"kvmtune audit --host   : median {c['median_ms']:.1f} ms, max {c['max_ms']:.1f} ms (whole command)")
    print("image audit (kvmtune's own time, then qemu-img's)   target < 100 ms + qemu-img")
    for r in res["images"]:  # type: ignore[union-attr]
        print(f"  {r['image']:18} own median {r['own_median_ms']:6.1f} ms  max {r['own_max_ms']:6.1f} ms   "
              f"qemu-img {r['qemu_img_median_ms']:6.1f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    ok = h["max_ms"] < 1000 and all(float(r["own_max_ms"]) < 100 for r in res["images"])  # type: ignore[union-attr,arg-type]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
