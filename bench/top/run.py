"""Cost of sampling 100 running guests: `kvmtune sample`'s per-interval work (goal: one sample of 100
guests <= 20 ms of CPU, so <= 1 % of one CPU at a 2 s interval; wall <= 200 ms), and of `kvmtune why`'s
per-second tick on this live host (every thread's stat: goal <= 2 % of one CPU).

100 real guests do not fit on this machine, so the guests are a fixture /proc tree (each QEMU process
with 2 vCPU threads: exe link, cmdline, comm, schedstat, status) plus 100 QMP monitors on unix sockets,
served by one helper process that answers the greeting, qmp_capabilities and query-blockstats with
replies shaped like QEMU 7.2's. The /proc reads and QMP round trips are real; only the peer is a stand-in.

`why`'s tick reads the real /proc of this machine (all its threads), as `why` does while it samples.

Run: .venv/bin/python bench/top/run.py [--guests 100] [--rounds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from kvmtune.host.root import HostRoot
from kvmtune.live.diagnose import Diagnoser
from kvmtune.live.signals import rates
from kvmtune.live.sources import Sampler
from kvmtune.live.why.core import TICK_S, Target
from kvmtune.live.why.tracker import Tracker
from kvmtune.qemuopts import keyval, unix_socket

BLOCKSTATS = {"return": [{"device": f"drive{i}", "qdev": f"/machine/peripheral/virtio-disk{i}/virtio-backend",
                          "stats": {"rd_operations": 100, "wr_operations": 200, "flush_operations": 3,
                                    "rd_bytes": 409600, "wr_bytes": 819200, "rd_total_time_ns": 10**7,
                                    "wr_total_time_ns": 3 * 10**7, "flush_total_time_ns": 10**6}}
                         for i in range(2)]}


async def _serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b'{"QMP": {"version": {"qemu": {"major": 7, "minor": 2, "micro": 0}}, "capabilities": []}}\n')
    await writer.drain()
    while line := await reader.readline():
        cmd = json.loads(line).get("execute")
        reply = BLOCKSTATS if cmd == "query-blockstats" else {"return": {}}
        writer.write(json.dumps(reply).encode() + b"\n")
        await writer.drain()


def serve(paths: list[str], ready: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    async def main() -> None:
        for p in paths:
            await asyncio.start_unix_server(_serve_one, path=p)
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


def make_tree(root: Path, sockdir: Path, guests: int) -> list[str]:
    def write(path: str, text: str) -> None:
        p = root / path.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)

    write("/proc/stat", "cpu  100 0 0 900 0 0 0 0 0 0\ncpu0 1 0 0 1 0 0 0 0 0 0\n")
    write("/proc/pressure/memory", "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    paths = []
    for i in range(guests):
        pid = 1000 + 10 * i
        sock = str(sockdir / f"g{i}.qmp")
        paths.append(sock)
        proc = root / "proc" / str(pid)
        proc.mkdir(parents=True)
        os.symlink("/usr/bin/qemu-system-x86_64", proc / "exe")
        argv = ["qemu-system-x86_64", "-name", keyval(("guest", f"vm{i}"), ("debug-threads", True)), "-m", "2048",
                "-smp", "2", "-qmp", keyval(("server", True), ("wait", False), first=unix_socket(Path(sock)))]
        (proc / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        write(f"/proc/{pid}/status", f"Name:\tqemu\nUid:\t{os.getuid()}\t0\t0\t0\n")
        for v in range(2):
            tid = pid + 1 + v
            write(f"/proc/{pid}/task/{tid}/comm", f"CPU {v}/KVM\n")
            write(f"/proc/{pid}/task/{tid}/schedstat", "123456789 2345678 99\n")
            write(f"/proc/{pid}/task/{tid}/status", "Cpus_allowed_list:\t0-15\n")
    return paths


def why_tick_cost(rounds: int) -> tuple[float, int]:
    """CPU ms of one `why` tick on this live host (median), and how many threads it read."""
    host = HostRoot("/")
    me = os.getpid()
    tracker = Tracker(host, Target("bench", f"pid {me}", "", me, None, False), {})
    tracker.tick()
    cpus = []
    for _ in range(rounds):
        c0 = resource.getrusage(resource.RUSAGE_SELF)
        tracker.tick()
        c1 = resource.getrusage(resource.RUSAGE_SELF)
        cpus.append((c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime))
    return statistics.median(cpus) * 1e3, len(tracker.prev)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--guests", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root, sockdir = Path(tmp) / "root", Path(tmp) / "s"
        sockdir.mkdir()
        paths = make_tree(root, sockdir, args.guests)
        # QMP paths on the command lines are host paths, which the sampler maps below the fixture root
        for p in paths:
            (root / p.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        ready = multiprocessing.Event()
        server = multiprocessing.Process(target=serve, args=([str(root / p.lstrip("/")) for p in paths], ready),
                                         daemon=True)
        server.start()
        ready.wait(30)
        host = HostRoot(str(root))
        sampler = Sampler(host, [])
        diag = Diagnoser(host)
        first = sampler.snapshot()  # connects to every monitor once; later samples reuse the connections
        assert len(first.guests) == args.guests, len(first.guests)
        assert all(len(g.disks) == 2 and len(g.vcpus) == 2 for g in first.guests.values()), "QMP or /proc not read"
        walls, cpus = [], []
        prev = first
        for _ in range(args.rounds):
            c0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            snap = sampler.snapshot()
            diag.diagnose(rates(prev, snap), snap)
            w1, c1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
            walls.append(w1 - w0)
            cpus.append((c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime))
            prev = snap
        sampler.close()
        server.terminate()
    wall_ms, cpu_ms = statistics.median(walls) * 1e3, statistics.median(cpus) * 1e3
    why_ms, threads = why_tick_cost(args.rounds)
    load = os.getloadavg()[0]
    result = {"guests": args.guests, "rounds": args.rounds, "sample_wall_ms_median": round(wall_ms, 1),
              "sample_wall_ms_max": round(max(walls) * 1e3, 1), "sample_cpu_ms_median": round(cpu_ms, 1),
              "cpu_share_at_2s_interval_percent": round(cpu_ms / 2000 * 100, 2),
              "why_tick_cpu_ms_median": round(why_ms, 1), "why_host_threads": threads,
              "why_cpu_share_percent": round(why_ms / (TICK_S * 1000) * 100, 2), "cores": os.cpu_count(),
              "loadavg_1m": round(load, 2),
              "goal": "sample: CPU <= 20 ms (1 % of one CPU at 2 s), wall <= 200 ms; why: <= 2 % of one CPU"}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
