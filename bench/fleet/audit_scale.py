"""`kvmtune audit -c URI` of a libvirt holding many defined domains, side by side with the floor: one process
that lists the domains through libvirt's API, fetches each one's XML and parses it with lxml.

Goal (issue 38, goal 1; first set by issue 21): at 1,000 domains, the audit's median wall time at most 2.0x
the floor's and its peak RSS at most 100 MiB; 10,000 domains show how the cost grows. The domains live in
libvirt's test driver (`test:///FILE`, a node file written here from the bundled example domains,
round-robin, each renamed): the real libvirt API and XML, without a daemon, so nothing on this host changes.
Both sides pay the test driver's parse of that file when they connect. `--uri qemu:///system` measures a live
libvirtd instead (define the domains there yourself first).

Each round runs both sides, each in a fresh process, one after the other, the order swapped every round
(floor first, then audit first) so that both see the same machine load; each round gives one audit/floor
ratio. Both sides run pinned to one CPU (`--cpu`, by default the last one: CPU 1 on a 2-core machine;
they never run at once, so one CPU serves both), by the same interpreter, the audit being this tree's
kvmtune (its `src/` first on the path). Wall and CPU (user + system) time and peak RSS come from the
kernel's accounting of each child (wait4). Prints, per domain count: the median of each side, the spread of
the per-round ratios, the peak RSS, the core count, the load average before and after, and the goal with
met or NOT met. Timing holds `/tmp/kvmtune-measure.lock` (flock), so benchmarks of others sharing the
machine wait for it. Exits 1 if the goal is missed at 1,000 domains.

`--instructions` counts each side's instructions once under valgrind (cachegrind) instead: a ratio no
other load on the machine changes, to compare two versions by on a shared machine (a minute or two).

    .venv/bin/python bench/fleet/audit_scale.py [--domains 1000 10000] [--rounds 5] [--cpu N] [--instructions]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/measuring.py
from measuring import loadavg, measure_lock, spread

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "src" / "kvmtune" / "examples").glob("*.xml"))
GOAL_DOMAINS = 1000
GOAL_RATIO = 2.0
GOAL_PEAK_MIB = 100.0
FLOOR = """
import sys, libvirt
from lxml import etree
conn = libvirt.openReadOnly(sys.argv[1])
n = 0
for dom in conn.listAllDomains(0):
    etree.fromstring(dom.XMLDesc(0).encode())
    n += 1
print(n)
"""
# what the installed `kvmtune` script runs, importing this tree's kvmtune (PYTHONPATH below)
KVMTUNE = "import sys; from kvmtune.cli import main; sys.exit(main())"


def node_file(path: Path, count: int) -> None:
    bodies = [re.sub(r"<\?xml[^>]*>", "", p.read_text()) for p in EXAMPLES]
    with open(path, "w") as fh:
        fh.write("<node>\n")
        for i in range(count):
            body = re.sub(r"<name>[^<]*</name>", f"<name>vm{i:06d}</name>", bodies[i % len(bodies)], count=1)
            fh.write(re.sub(r"<uuid>[^<]*</uuid>", "", body))
        fh.write("</node>\n")


def sides(uri: str) -> dict[str, list[str]]:
    return {"floor": [sys.executable, "-c", FLOOR, uri],
            "audit": [sys.executable, "-c", KVMTUNE, "audit", "-c", uri, "--format", "json", "-o", os.devnull]}


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed kvmtune has its bytecode compiled: do not time the compiler
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), *filter(None, [env.get("PYTHONPATH")])])
    return env


@dataclass(frozen=True)
class Run:
    wall: float  # seconds
    cpu: float  # user + system seconds
    peak_mib: float


def timed(argv: list[str], cpu: int | None) -> Run:
    """One fresh process, pinned to ``cpu``: its wall and CPU time and peak RSS, as the kernel accounted them."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=child_env(),
                                preexec_fn=None if cpu is None else lambda: os.sched_setaffinity(0, {cpu}))
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode not in (0, 1):  # 1: the audit found something at --fail-on; not a failure here
            err.seek(0)
            raise SystemExit(f"{' '.join(argv[:4])}... exited {proc.returncode}: "
                             f"{err.read()[-500:].decode(errors='replace')}")
    return Run(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024)





def side_by_side(uri: str, rounds: int, cpu: int | None) -> dict[str, list[Run]]:
    argv = sides(uri)
    for side in argv.values():  # untimed: bytecode written, the node file and libraries in the page cache
        timed(side, cpu)
    runs: dict[str, list[Run]] = {"floor": [], "audit": []}
    for n in range(rounds):
        for side in ("floor", "audit") if n % 2 == 0 else ("audit", "floor"):
            runs[side].append(timed(argv[side], cpu))
    return runs


def report(count: int | str, runs: dict[str, list[Run]], cpu: int | None, load: tuple[str, str]) -> dict[str, object]:
    floor, audit = runs["floor"], runs["audit"]
    wall_ratios = [a.wall / f.wall for f, a in zip(floor, audit, strict=True)]
    cpu_ratios = [a.cpu / f.cpu for f, a in zip(floor, audit, strict=True)]
    med = {side: (statistics.median(r.wall for r in rs), statistics.median(r.cpu for r in rs)) for side, rs in runs.items()}
    peak = {side: max(r.peak_mib for r in rs) for side, rs in runs.items()}
    ratio = statistics.median(wall_ratios)
    pinned = f"both sides pinned to CPU {cpu}" if cpu is not None else "not pinned"
    print(f"== {count} domains, {len(floor)} rounds: {os.cpu_count()} cores, {pinned}; "
          f"load average {load[0]} before, {load[1]} after")
    for side in ("floor", "audit"):
        print(f"{side:5s}: median {med[side][0] * 1000:6.0f} ms wall, {med[side][1] * 1000:6.0f} ms CPU; "
              f"peak RSS {peak[side]:.1f} MiB")
    print(f"ratio audit/floor, per round, wall: {spread(wall_ratios)}")
    print(f"ratio audit/floor, per round, CPU:  {spread(cpu_ratios)}")
    row: dict[str, object] = {
        "domains": count, "rounds": len(floor), "cores": os.cpu_count(), "cpu_pinned": cpu,
        "loadavg_before": load[0], "loadavg_after": load[1],
        "floor_wall_s": round(med["floor"][0], 3), "audit_wall_s": round(med["audit"][0], 3),
        "floor_cpu_s": round(med["floor"][1], 3), "audit_cpu_s": round(med["audit"][1], 3),
        "ratio_wall": round(ratio, 2), "ratios_wall_per_round": [round(r, 2) for r in wall_ratios],
        "ratio_cpu": round(statistics.median(cpu_ratios), 2),
        "floor_peak_mib": round(peak["floor"], 1), "audit_peak_mib": round(peak["audit"], 1),
    }
    if count == GOAL_DOMAINS:
        met = ratio <= GOAL_RATIO and peak["audit"] <= GOAL_PEAK_MIB
        row["goal_met"] = met
        print(f"goal at {GOAL_DOMAINS} domains: median wall ratio {ratio:.2f} <= {GOAL_RATIO} and peak "
              f"{peak['audit']:.1f} MiB <= {GOAL_PEAK_MIB:.0f} MiB: {'met' if met else 'NOT met'}")
    print(json.dumps(row), flush=True)
    return row


def instructions(argv: list[str]) -> int:
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null", *argv]
    out = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), check=False).stderr
    found = re.search(r"I\s+refs:\s+([\d,]+)", out)
    if not found:
        raise SystemExit(f"valgrind printed no instruction count:\n{out[-500:]}")
    return int(found.group(1).replace(",", ""))


def count_instructions(count: int | str, uri: str) -> None:
    argv = sides(uri)
    timed(argv["audit"], None)  # bytecode written outside the count
    ir = {side: instructions(a) for side, a in argv.items()}
    print(f"== {count} domains, instructions (valgrind, user space, whole process): floor {ir['floor'] / 1e6:.0f} M, "
          f"audit {ir['audit'] / 1e6:.0f} M, ratio {ir['audit'] / ir['floor']:.2f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--domains", type=int, nargs="+", default=[GOAL_DOMAINS, 10000])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cpu", type=int, default=(os.cpu_count() or 1) - 1,
                    help="the CPU both sides run on (default: the last)")
    ap.add_argument("--no-pin", action="store_true", help="let the scheduler place both sides")
    ap.add_argument("--instructions", action="store_true", help="count instructions under valgrind instead of timing")
    ap.add_argument("--uri", help="measure this libvirt instead of a generated test-driver node file")
    args = ap.parse_args()
    if args.instructions and shutil.which("valgrind") is None:
        print("valgrind is not installed", file=sys.stderr)
        return 2
    cpu = None if args.no_pin else args.cpu
    missed = False
    with tempfile.TemporaryDirectory(prefix="kvmtune-fleet-bench-") as tmp:
        targets: list[tuple[int | str, str]] = []
        if args.uri:
            targets.append(("as defined", args.uri))
        else:
            for count in args.domains:
                node = Path(tmp) / f"node-{count}.xml"
                node_file(node, count)
                targets.append((count, f"test://{node}"))
        for count, uri in targets:
            if args.instructions:
                count_instructions(count, uri)
                continue
            with measure_lock():
                before = loadavg()
                runs = side_by_side(uri, args.rounds, cpu)
                after = loadavg()
            row = report(count, runs, cpu, (before, after))
            missed |= row.get("goal_met") is False
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
