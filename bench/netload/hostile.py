#!/usr/bin/env python3
"""netload serve under hostile load: idle connections and slowloris clients.

Starts ``netload serve`` with a token on loopback, opens IDLE silent TCP
connections and SLOW "slowloris" clients that trickle a hello one byte at a
time, and while they are held runs a legitimate ``netload run`` (with the
token) ROUNDS times. It reports whether every legitimate run succeeded, its
transactions per second, and the server's resident memory (VmRSS, VmHWM)
before, during and after the attack. A client without the token is also
tried: it must be refused in one line.

    bench/netload/hostile.py                     # IDLE=5000 SLOW=50 ROUNDS=3
    IDLE=5000 SLOW=200 DURATION=3 bench/netload/hostile.py

Traffic stays on 127.0.0.1; every process and socket it opens is closed on
exit. Results: a table on stdout and JSON in OUT (default results/hostile-latest.json).
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NETLOAD = os.environ.get("NETLOAD") or str(HERE.parent.parent / "netload" / "bin" / "netload")
IDLE = int(os.environ.get("IDLE", "5000"))
SLOW = int(os.environ.get("SLOW", "50"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
DURATION = os.environ.get("DURATION", "3")
PORT = int(os.environ.get("NL_PORT", "20941"))
OUT = Path(os.environ.get("OUT", str(HERE / "results" / "hostile-latest.json")))
TOKEN = os.urandom(16).hex()
HOST = "127.0.0.1"


def mem(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM", "Threads"):
            out[k] = int(v.split()[0]) * (1024 if k != "Threads" else 1)
    return out


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def legit(extra_env: dict[str, str] | None = None) -> dict[str, object]:
    env = dict(os.environ, NETLOAD_TOKEN=TOKEN) if extra_env is None else dict(os.environ, **extra_env)
    t0 = time.monotonic()
    p = subprocess.run([NETLOAD, "run", "--workload", "rr1c-1x1--1", "--duration", f"{DURATION}s",
                        "--remote", f"{HOST}:{PORT}", "--json", "-q"], capture_output=True, text=True, env=env,
                       timeout=60)
    res: dict[str, object] = {"exit": p.returncode, "wall_s": round(time.monotonic() - t0, 2),
                              "stderr": p.stderr.strip()}
    if p.stdout.strip():
        doc = json.loads(p.stdout)
        res["transactions_per_s"] = doc["summary"]["transactions_per_s"]
        res["p99_us"] = doc["summary"]["txn_time_ns"]["p99"] / 1e3
    return res


def main() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = IDLE + SLOW + 256
    if want > hard:
        print(f"hostile.py: needs {want} file descriptors, the hard limit is {hard}", file=sys.stderr)
        return 2
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    srv = subprocess.Popen([NETLOAD, "serve", "--listen", f"{HOST}:{PORT}", "-q"],
                           env=dict(os.environ, NETLOAD_TOKEN=TOKEN), stdout=subprocess.DEVNULL)
    socks: list[socket.socket] = []
    stop = threading.Event()
    try:
        for _ in range(100):
            try:
                socket.create_connection((HOST, PORT), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        time.sleep(0.2)
        res: dict[str, object] = {"idle": IDLE, "slow": SLOW, "rounds": ROUNDS, "duration_s": float(DURATION),
                                  "ncpu": os.cpu_count(), "load_average_1m": os.getloadavg()[0]}
        res["baseline"] = legit()
        res["server_before"] = mem(srv.pid)
        opened = refused = 0
        for _ in range(IDLE):
            try:
                s = socket.create_connection((HOST, PORT), timeout=2)
                socks.append(s)
                opened += 1
            except OSError:
                refused += 1
        slow_socks = []
        for _ in range(SLOW):
            try:
                s = socket.create_connection((HOST, PORT), timeout=2)
                slow_socks.append(s)
            except OSError:
                refused += 1
        socks += slow_socks
        res["idle_opened"], res["connect_failures"] = opened, refused

        def trickle() -> None:
            hello = b'{"type":"hello","magic":"netload-control","version":1,"profile":' + b" " * 100000
            i = 0
            while not stop.is_set():
                for s in slow_socks:
                    try:
                        s.send(hello[i:i + 1])
                    except OSError:
                        pass
                i += 1
                stop.wait(0.5)

        th = threading.Thread(target=trickle, daemon=True)
        th.start()
        time.sleep(1)
        res["server_under_attack"] = mem(srv.pid) | {"fds": fds(srv.pid)}
        runs = []
        for _ in range(ROUNDS):
            runs.append(legit())
        res["legit_runs"] = runs
        res["no_token"] = legit({"NETLOAD_TOKEN": ""})
        res["server_after_runs"] = mem(srv.pid) | {"fds": fds(srv.pid)}
        # what is still open on the client side: the server closed the rest
        alive = 0
        for s in socks:
            try:
                s.setblocking(False)
                if s.recv(1) == b"":
                    continue
            except BlockingIOError:
                alive += 1
            except OSError:
                continue
        res["attack_sockets_still_open"] = alive
    finally:
        stop.set()
        for s in socks:
            s.close()
        srv.terminate()
        srv.wait(10)
    ok = all(r["exit"] == 0 for r in runs) and res["no_token"]["exit"] == 4  # type: ignore[index]
    res["ok"] = ok
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(res, indent=2))
    mib = 1 / 2**20
    b, a, f = res["server_before"], res["server_under_attack"], res["server_after_runs"]
    print(f"netload serve under {opened} idle connections and {len(slow_socks)} slowloris clients "
          f"(ncpu {res['ncpu']}, load average {res['load_average_1m']:.2f})")
    print(f"  baseline legit run: {res['baseline'].get('transactions_per_s', 0):.0f} txn/s")  # type: ignore[union-attr]
    for i, r in enumerate(runs, 1):
        print(f"  legit run {i} under attack: exit {r['exit']}, {r.get('transactions_per_s', 0):.0f} txn/s, "
              f"p99 {r.get('p99_us', 0):.0f} us, {r['wall_s']} s")
    print(f"  client without the token: exit {res['no_token']['exit']}: {res['no_token']['stderr']}")  # type: ignore[index]
    print(f"  server VmRSS: before {b['VmRSS'] * mib:.1f} MiB, under attack {a['VmRSS'] * mib:.1f} MiB, "
          f"after the runs {f['VmRSS'] * mib:.1f} MiB; VmHWM {f['VmHWM'] * mib:.1f} MiB; "
          f"server fds {a['fds']} (of {opened + len(slow_socks)} attack sockets), threads {f['Threads']}")
    print(f"  attack sockets the server had not closed at the end: {alive}")
    print(f"  {'OK' if ok else 'FAILED'}; written to {OUT}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
