"""Start-up time of three everyday commands, side by side with Python's own start (issue 38, goal 3).

Goals (wall time, one fresh process each): ``kvmtune --version`` <= 100 ms, ``kvmtune rules list``
<= 150 ms, ``kvmtune audit one.xml`` <= 250 ms. Each round runs every command and both floors
(``python -c pass``, ``python -S -c pass``) once, in one order that rotates from round to round, so all
of them see the same load; with two or more cores every run is pinned to CPU 1 (``taskset -c 1``:
this process pins itself and the children inherit it). Prints, per command, the median wall time, the
spread (min-max and the interquartile range), the child's own CPU time (user + system, from ``wait4``:
far less sensitive to what else the machine runs), the median of the per-round ratio to
``python -c pass``, the goal and pass/miss; then the core count and the load average before and after.
Holds ``flock /tmp/kvmtune-measure.lock`` while it times. Exits 1 when a median misses its goal.

What it runs is what users run: the console script beside this interpreter (``.venv/bin/kvmtune``,
``[project.scripts] kvmtune = "kvmtune.cli:main"``) when there is one, else ``python -m kvmtune``; it
says which. ``PYTHONPATH`` is set to this tree's ``src`` (the venv's editable install may point at
another checkout), for the floors too. Bytecode is cached as in an installed kvmtune (pip and the .deb compile
it), in a scratch ``PYTHONPYCACHEPREFIX`` removed at the end, whatever ``PYTHONDONTWRITEBYTECODE`` says;
``--compile-each-start`` measures a checkout run with ``PYTHONDONTWRITEBYTECODE=1`` instead, which compiles
every kvmtune module it imports on every start (the issue's 0.33 s for ``--version`` was taken that way).

    .venv/bin/python bench/startup/run.py [--rounds N] [--importtime] [--compile-each-start] [--xml FILE]

``--importtime`` also prints, for each command, the 15 largest cumulative ``-X importtime`` entries
(one extra run each, outside the timing; the console script is run as ``python -X importtime SCRIPT``).
``-X importtime`` does not see modules imported through ``importlib.import_module``: the rule modules
(``audit/rule.py``'s ``all_rules``) are missing from it, and what they import shows at the top level.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/measuring.py
from measuring import loadavg, measure_lock

REPO = Path(__file__).resolve().parents[2]
ROUNDS = 20
DEFAULT_XML = REPO / "examples" / "web01-legacy.xml"


@dataclass
class Case:
    label: str
    argv: list[str]
    env: dict[str, str]
    goal_ms: float | None = None  # None: a floor or the baseline, reported beside the goals
    kind: str = "goal"  # goal, baseline or floor
    wall_ms: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)


def entry_point() -> tuple[list[str], str]:
    """The command users run: the console script next to this interpreter, else ``python -m kvmtune``."""
    script = Path(sys.executable).parent / "kvmtune"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)], f"console script {script} ([project.scripts] kvmtune = kvmtune.cli:main)"
    return [sys.executable, "-m", "kvmtune"], f"{sys.executable} -m kvmtune (no console script beside the interpreter)"


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """Wall and CPU (user + system, the child's own) milliseconds of one run, and its exit status."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = (time.perf_counter() - start) * 1000
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here; keep Popen from waiting again
    return wall, (usage.ru_utime + usage.ru_stime) * 1000, proc.returncode


def quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def importtime_top(argv: list[str], env: dict[str, str], top: int = 15) -> list[tuple[int, int, str]]:
    """The ``top`` largest cumulative ``-X importtime`` entries (microseconds self, cumulative, module)."""
    run = [sys.executable, "-X", "importtime", *(argv[1:] if argv[0] == sys.executable else argv)]
    proc = subprocess.run(run, env=env, capture_output=True, text=True, check=False)
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "imported package" in line:
            continue
        self_us, cumulative, name = line[len("import time:"):].split("|", 2)
        rows.append((int(self_us), int(cumulative), name.rstrip()))
    return sorted(rows, key=lambda r: -r[1])[:top]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--rounds", type=int, default=ROUNDS, help=f"rounds (default {ROUNDS})")
    ap.add_argument("--xml", type=Path, default=DEFAULT_XML, help="the domain XML `audit` reads (default: %(default)s)")
    ap.add_argument("--importtime", action="store_true", help="print each command's top 15 cumulative imports")
    ap.add_argument("--baseline-src", type=Path, default=None, metavar="DIR",
                    help="also time the three commands with PYTHONPATH=DIR (another checkout's src, e.g. main's from "
                    "`git archive main src | tar -x -C /tmp/old`), alternating in the same rounds")
    ap.add_argument("--compile-each-start", action="store_true",
                    help="write no bytecode cache, so every start compiles kvmtune's modules (PYTHONDONTWRITEBYTECODE=1, "
                    "as this development machine sets it); default: cached, as an installed kvmtune runs")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if not args.xml.is_file():
        ap.error(f"{args.xml}: no such file")
    if args.baseline_src is not None and not (args.baseline_src / "kvmtune" / "cli" / "__init__.py").is_file():
        ap.error(f"{args.baseline_src}: no kvmtune/cli/__init__.py below it (give a src folder)")

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    env.update(PYTHONPATH=str(REPO / "src"), NO_COLOR="1")
    if args.compile_each_start:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        trees = [REPO / "src", *([args.baseline_src] if args.baseline_src else [])]
        stale = sum(1 for tree in trees for _ in tree.rglob("__pycache__"))
        how = "no bytecode cache written: kvmtune's modules compiled on every start (the standard library's are cached)"
        return measure(args, env, how + (f"; {stale} __pycache__ folders in the tree are read" if stale else ""))
    # an installed kvmtune has its bytecode compiled (pip and the .deb's postinst do it): do not time the
    # compiler. The cache goes to a scratch prefix, removed at the end, not into the tree.
    with tempfile.TemporaryDirectory(prefix="kvmtune-startup-pyc-") as pycache:
        env["PYTHONPYCACHEPREFIX"] = pycache
        return measure(args, env, "bytecode cached, as installed (a scratch PYTHONPYCACHEPREFIX)")


def measure(args: argparse.Namespace, env: dict[str, str], bytecode: str) -> int:
    kvmtune, how = entry_point()
    commands = [("--version", 100.0), ("rules list", 150.0), (f"audit {args.xml}", 250.0)]
    cases = [Case(f"kvmtune {words.replace(str(args.xml), args.xml.name)}", [*kvmtune, *words.split()], env, goal)
             for words, goal in commands]
    if args.baseline_src is not None:
        old = dict(env, PYTHONPATH=str(args.baseline_src.resolve()))
        cases += [Case(f"{c.label} (baseline)", c.argv, old, kind="baseline") for c in cases]
    cases += [Case("python -c pass", [sys.executable, "-c", "pass"], env, kind="floor"),
              Case("python -S -c pass", [sys.executable, "-S", "-c", "pass"], env, kind="floor")]
    floor = next(c for c in cases if c.label == "python -c pass")
    cores = os.cpu_count() or 1
    cpu = 1 if cores >= 2 else None
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})  # taskset -c 1: every child inherits it (this process waits while they run)
    for case in cases:  # a command that fails is no figure; this run also fills the bytecode cache
        _, _, code = run_once(case.argv, case.env)
        if code not in (0, 1):  # audit: 1 is "findings at --fail-on"
            print(f"startup: {case.label} exits {code}", file=sys.stderr)
            return 2

    with measure_lock():
        load_before = loadavg()
        for rnd in range(args.rounds):
            shift = rnd % len(cases)
            for case in cases[shift:] + cases[:shift]:  # each round in a rotated order
                wall, cpu_ms, _ = run_once(case.argv, case.env)
                case.wall_ms.append(wall)
                case.cpu_ms.append(cpu_ms)
        load_after = loadavg()

    print(f"kvmtune start-up: {args.rounds} rounds, each command once per round in rotating order")
    print(f"runs: {how}; PYTHONPATH={REPO / 'src'}"
          + (f" (baseline: {args.baseline_src.resolve()})" if args.baseline_src else ""))
    print(f"bytecode: {bytecode}")
    print(f"cores {cores}, pinned to CPU {cpu}" if cpu is not None else f"cores {cores}, not pinned")
    print(f"load average before {load_before}, after {load_after}\n")
    print(f"{'command':<44} {'median':>8} {'min-max':>15} {'IQR':>15} {'cpu med':>8} {'x pass':>7} {'goal':>7}  result")
    missed = 0
    for case in cases:
        med = statistics.median(case.wall_ms)
        q1, q3 = quartiles(case.wall_ms)
        ratio = statistics.median(w / f for w, f in zip(case.wall_ms, floor.wall_ms, strict=True))
        goal = f"{case.goal_ms:.0f}" if case.goal_ms is not None else "-"
        result = case.kind if case.goal_ms is None else ("pass" if med <= case.goal_ms else "MISS")
        missed += result == "MISS"
        print(f"{case.label:<44} {med:7.1f}ms {min(case.wall_ms):6.1f}-{max(case.wall_ms):6.1f}ms "
              f"{q1:6.1f}-{q3:6.1f}ms {statistics.median(case.cpu_ms):6.1f}ms {ratio:6.2f}x {goal:>5}ms  {result}")
    print("\n(ms wall per fresh process; 'cpu med': the child's user+system CPU; 'x pass': median of per-round "
          "ratios to `python -c pass`)")

    if args.importtime:
        for case in cases:
            if case.kind == "floor":
                continue
            print(f"\n-X importtime, top 15 cumulative: {case.label}")
            print(f"{'self us':>9} {'cumul us':>9}  module")
            for self_us, cumulative, name in importtime_top(case.argv, case.env):
                print(f"{self_us:9d} {cumulative:9d}  {name}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
