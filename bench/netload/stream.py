#!/usr/bin/env python3
"""The stream alone: netload builds against ``iperf3 -l 30720``, quickly.

``compare.sh`` runs every comparison of issue 16; this runs only
``str-writex30k--1``, the way compare.sh does (client on CPU 0, server on
CPU 1, long-running servers, tools taking turns with the order flipped every
round), for one or more netload builds beside iperf3, and adds what explains
the CPU figures:

* CPU-s per GB of each side (the client's rusage, the server's /proc stat);
* the client's user-space share of it;
* the server's voluntary context switches per GB (every thread): how often
  the receiver went to sleep;
* CPU halts per GB of the server's CPU (cpuidle state usage): on a VM every
  halt is ended by an interrupt that the sending CPU pays for.

    bench/netload/stream.py [NETLOAD ...]        # ROUNDS=6 DURATION=3

Each build's figures are given as the median of its per-round ratios to
iperf3's, with their spread, beside each round's load average. Traffic stays
on 127.0.0.1; every server it starts is stopped on exit. JSON: OUT
(default /tmp/netload-stream.json).
"""

from __future__ import annotations

import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

ROUNDS = int(os.environ.get("ROUNDS", "6"))
DURATION = int(os.environ.get("DURATION", "3"))
CLIENT_CPU = os.environ.get("CLIENT_CPU", "0")
SERVER_CPU = os.environ.get("SERVER_CPU", "1")
OUT = os.environ.get("OUT", "/tmp/netload-stream.json")
TICK = os.sysconf("SC_CLK_TCK")
HALTS = f"/sys/devices/system/cpu/cpu{SERVER_CPU}/cpuidle"
KEYS = ("gbps", "client_cpu_s_per_gb", "client_user_s_per_gb", "server_cpu_s_per_gb", "server_sleeps_per_gb",
        "server_cpu_halts_per_gb")


def proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def sleeps(pid: int) -> int:
    n = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                n += sum(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))
        except OSError:
            pass
    return n


def halts() -> int:
    """Entries into the server CPU's idle states (0 where cpuidle is absent)."""
    try:
        return sum(int(open(f"{HALTS}/{s}/usage").read()) for s in os.listdir(HALTS) if s.startswith("state"))
    except OSError:
        return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int) -> None:
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"stream.py: nothing listens on {port}")


def measured(argv: list[str], server: subprocess.Popen[bytes]) -> tuple[str, dict[str, float]]:
    s0, w0, h0 = proc_cpu(server.pid), sleeps(server.pid), halts()
    u0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(["taskset", "-c", CLIENT_CPU, *argv], capture_output=True, text=True, timeout=DURATION + 60)
    u1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        sys.exit(f"stream.py: {argv[0]} failed: {(out.stdout + out.stderr).strip()[-300:]}")
    user = u1.ru_utime - u0.ru_utime
    return out.stdout, {"client_cpu": user + u1.ru_stime - u0.ru_stime, "client_user": user,
                        "server_cpu": proc_cpu(server.pid) - s0, "server_sleeps": sleeps(server.pid) - w0,
                        "server_cpu_halts": halts() - h0}


def per_gb(raw: dict[str, float], gb: float, gbps: float) -> dict[str, float]:
    counts = ("server_sleeps", "server_cpu_halts")
    return {"gbps": gbps, **{f"{k}_per_gb" if k in counts else f"{k}_s_per_gb": v / gb for k, v in raw.items()}}


def main() -> None:
    builds = sys.argv[1:] or [os.path.join(os.path.dirname(__file__), "..", "..", "netload", "bin", "netload")]
    servers: list[subprocess.Popen[bytes]] = []
    ports: dict[str, int] = {}
    try:
        for b in builds:
            ports[b] = free_port()
            servers.append(subprocess.Popen(["taskset", "-c", SERVER_CPU, b, "serve", "--listen", f"127.0.0.1:{ports[b]}", "-q"],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_port(ports[b])
        ip_port = free_port()
        iperf = subprocess.Popen(["taskset", "-c", SERVER_CPU, "iperf3", "-s", "-p", str(ip_port), "-B", "127.0.0.1"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        servers.append(iperf)
        time.sleep(0.5)  # iperf3: no probe, it would count it as a test
        tools = [*builds, "iperf3"]
        rounds: list[dict[str, Any]] = []
        for r in range(ROUNDS):
            row: dict[str, Any] = {"load_average_1m": os.getloadavg()[0]}
            for t in tools if r % 2 == 0 else tools[::-1]:
                if t == "iperf3":
                    argv = ["iperf3", "-c", "127.0.0.1", "-p", str(ip_port), "-l", "30720", "-t", str(DURATION), "-J"]
                    out, raw = measured(argv, iperf)
                    e = json.loads(out)["end"]["sum_received"]
                    row[t] = per_gb(raw, e["bytes"] / 1e9, e["bits_per_second"] / 1e9)
                else:
                    srv = servers[builds.index(t)]
                    out, raw = measured([t, "run", "--workload", "str-writex30k--1", "--duration", f"{DURATION}s",
                                         "--remote", f"127.0.0.1:{ports[t]}", "--json", "-q"], srv)
                    s = json.loads(out)["summary"]
                    row[t] = per_gb(raw, s["bytes"] / 1e9, s["throughput_bits_per_s"] / 1e9)
            rounds.append(row)
            print(f"round {r + 1}: load {row['load_average_1m']:.2f}; " + "; ".join(
                f"{'iperf3' if t == 'iperf3' else f'build {builds.index(t) + 1}'} {row[t]['gbps']:.1f} Gb/s, "
                f"client {row[t]['client_cpu_s_per_gb']:.3f} s/GB" for t in tools), flush=True)
    finally:
        for p in servers:
            p.terminate()
        for p in servers:
            p.wait()
    print(f"\n{os.cpu_count()} CPUs; client on CPU {CLIENT_CPU}, server on CPU {SERVER_CPU}; load average per round: "
          + " ".join(f"{row['load_average_1m']:.2f}" for row in rounds))
    print(f"{'':10}{'metric':26}{'median':>10}{'iperf3':>10}   build:iperf3 per round, median (spread)")
    summary: dict[str, dict[str, Any]] = {}
    for i, b in enumerate(builds):
        summary[b] = {}
        for k in KEYS:
            ratios = [row[b][k] / row["iperf3"][k] for row in rounds if row["iperf3"][k] > 0]
            mine = statistics.median(row[b][k] for row in rounds)
            theirs = statistics.median(row["iperf3"][k] for row in rounds)
            summary[b][k] = {"median": mine, "iperf3_median": theirs, "ratios": ratios}
            spread = f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else "-"
            print(f"{f'build {i + 1}':10}{k:26}{mine:10.4g}{theirs:10.4g}   {spread}")
    with open(OUT, "w") as f:
        doc = {"builds": builds, "ncpu": os.cpu_count(), "rounds": rounds, "duration_s": DURATION, "summary": summary}
        json.dump(doc, f, indent=1)
    print(f"builds: {', '.join(f'{i + 1} = {b}' for i, b in enumerate(builds))}\nwritten to {OUT}")


if __name__ == "__main__":
    main()
