#!/usr/bin/env python3
"""Two netload builds side by side: did a change cost speed or CPU?

Runs ``rr1c-1x1--1`` and ``str-writex30k--1`` with build A and build B taking
turns (the order flips every round), the client pinned to CPU 0 and the
server to CPU 1, and reports per workload the median of the per-round B:A
ratios, with their spread, of the rate and of each side's CPU per unit of
work (netload's own figures: each process's rusage over the measured phase).
CPU per unit depends little on the machine's load; the load average of every
round is printed beside the figures.

    bench/netload/ab.py OLD_NETLOAD NEW_NETLOAD          # ROUNDS=7 DURATION=3

Traffic stays on 127.0.0.1; every server it starts is stopped on exit.
Results: a table on stdout and JSON in OUT (default /tmp/netload-ab.json).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time

ROUNDS = int(os.environ.get("ROUNDS", "7"))
DURATION = int(os.environ.get("DURATION", "3"))
CLIENT_CPU = os.environ.get("CLIENT_CPU", "0")
SERVER_CPU = os.environ.get("SERVER_CPU", "1")
OUT = os.environ.get("OUT", "/tmp/netload-ab.json")
WORKLOADS = ("rr1c-1x1--1", "str-writex30k--1")
METRICS = (  # (name, path in the document, unit)
    ("rate", ("summary", "transactions_per_s"), "txn/s"),
    ("client cpu/txn", ("cpu", "client", "process_cpu_us_per_txn"), "us"),
    ("server cpu/txn", ("cpu", "server", "process_cpu_us_per_txn"), "us"),
    ("client cpu/MB", ("cpu", "client", "process_cpu_s_per_mb"), "s"),
    ("server cpu/MB", ("cpu", "server", "process_cpu_s_per_mb"), "s"),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_run(netload: str, workload: str) -> dict[str, float]:
    port = free_port()
    server = subprocess.Popen(["taskset", "-c", SERVER_CPU, netload, "serve", "--listen", f"127.0.0.1:{port}", "-q", "--once"],
                              stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.02)
        out = subprocess.run(["taskset", "-c", CLIENT_CPU, netload, "run", "--workload", workload, "--duration", f"{DURATION}s",
                              "--remote", f"127.0.0.1:{port}", "--json"], capture_output=True, text=True, timeout=DURATION + 60)
        doc = json.loads(out.stdout)
        if out.returncode != 0 or doc.get("error"):
            sys.exit(f"ab.py: {netload} {workload}: exit {out.returncode}: {out.stderr.strip()}")
    finally:
        server.kill()
        server.wait()
    row: dict[str, float] = {}
    for name, path, _ in METRICS:
        v = doc
        for k in path:
            v = v[k]
        row[name] = float(v)
    return row


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit("usage: bench/netload/ab.py OLD_NETLOAD NEW_NETLOAD")
    builds = {"A": sys.argv[1], "B": sys.argv[2]}
    rounds: list[dict[str, object]] = []
    for r in range(ROUNDS):
        load = os.getloadavg()[0]
        order = ("A", "B") if r % 2 == 0 else ("B", "A")
        got: dict[str, dict[str, dict[str, float]]] = {w: {} for w in WORKLOADS}
        for w in WORKLOADS:
            for b in order:
                got[w][b] = one_run(builds[b], w)
        rounds.append({"load": load, "runs": got})
        print(f"round {r + 1}: load {load:.2f}; " + "; ".join(
            f"{w} A {got[w]['A']['rate']:.0f} B {got[w]['B']['rate']:.0f} txn/s" for w in WORKLOADS), flush=True)
    summary: dict[str, dict[str, list[float]]] = {}
    print(f"\n{os.cpu_count()} CPUs; client on CPU {CLIENT_CPU}, server on CPU {SERVER_CPU}; "
          f"A = {builds['A']}, B = {builds['B']}")
    print(f"{'workload':18} {'metric':16} {'A median':>10} {'B median':>10}   B:A per round, median (spread)")
    for w in WORKLOADS:
        summary[w] = {}
        for name, _, unit in METRICS:
            a = [float(x["runs"][w]["A"][name]) for x in rounds]  # type: ignore[index]
            b = [float(x["runs"][w]["B"][name]) for x in rounds]  # type: ignore[index]
            ratios = [y / x for x, y in zip(a, b, strict=True) if x > 0]
            if not ratios:
                continue
            summary[w][name] = ratios
            print(f"{w:18} {name:16} {statistics.median(a):10.4g} {statistics.median(b):10.4g}   "
                  f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) {unit}")
    print("load average per round: " + " ".join(f"{float(x['load']):.2f}" for x in rounds))  # type: ignore[arg-type]
    with open(OUT, "w") as f:
        json.dump({"builds": builds, "rounds": rounds, "ratios_b_over_a": summary, "ncpu": os.cpu_count(),
                   "duration_s": DURATION}, f, indent=1)
    print(f"written to {OUT}")


if __name__ == "__main__":
    main()
