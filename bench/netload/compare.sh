#!/usr/bin/env bash
# netload against sockperf (TCP ping-pong) and iperf3 (TCP stream) on loopback,
# measured the same way for every tool:
#   * the client is pinned to CPU 0 and the server to CPU 1 (taskset), for
#     netload and for each peer alike (CLIENT_CPU / SERVER_CPU to change);
#   * CPU per transaction and per GB come from each process's own CPU time
#     (the client's rusage, the server's utime+stime from /proc around the run);
#   * the tools take turns within every round (the order flips each round),
#     ROUNDS rounds (default 5) of DURATION seconds (default 3);
#   * the summary is the median of the per-round ratios with their spread,
#     beside the core count and the load average of every round;
#   * the stream is compared with `iperf3 -l 30720`, as the issue states; both
#     leave Nagle on (netload 0.2.0's stream workloads set no tcp_nodelay, as
#     iperf3 without -N and bulk transfers do; its request/response ones do);
#   * rr1c-1x1--250 and str-readx30k--250 are checked for errors, with each
#     side's peak memory.
#
#   bench/netload/compare.sh
#   ROUNDS=7 DURATION=5 bench/netload/compare.sh
#
# It runs unchanged from a copy on another machine: give it the static netload
# binary (NETLOAD=path, or netload next to this script, or in PATH) and have
# sockperf, iperf3, taskset and python3 there. Traffic stays on 127.0.0.1 and
# every process started here is stopped on exit. Results: a table on stdout
# and JSON in OUT (default results/latest.json next to this script).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "${NETLOAD:-}" ]; then
  for c in "$here/netload" "$here/../../netload/bin/netload" "$(command -v netload || true)"; do
    if [ -n "$c" ] && [ -x "$c" ]; then NETLOAD=$c; break; fi
  done
fi
for tool in "${NETLOAD:-netload}" sockperf iperf3 taskset python3; do
  command -v "$tool" >/dev/null || { echo "compare.sh: $tool not found (build netload with make -C netload build, or set NETLOAD)" >&2; exit 2; }
done
export NETLOAD HERE="$here"
exec python3 - "$@" <<'PY'
import json, os, re, resource, signal, statistics, subprocess, sys, time, platform
NETLOAD = os.environ["NETLOAD"]
ROUNDS = int(os.environ.get("ROUNDS", "5"))
DURATION = int(os.environ.get("DURATION", "3"))
CCPU = os.environ.get("CLIENT_CPU", "0")
SCPU = os.environ.get("SERVER_CPU", "1")
OUT = os.environ.get("OUT", os.path.join(os.environ["HERE"], "results", "latest.json"))
HOST = "127.0.0.1"
NL_PORT, SP_PORT, IP_PORT = (int(os.environ.get(k, d)) for k, d in (("NL_PORT", "20931"), ("SP_PORT", "20932"), ("IP_PORT", "20933")))
TICK = os.sysconf("SC_CLK_TCK")
DEVNULL = subprocess.DEVNULL
if ROUNDS < 1 or DURATION < 1:
    sys.exit("compare.sh: ROUNDS and DURATION must be at least 1")

def pin(cpu, argv):
    return ["taskset", "-c", cpu, *argv]

def proc_cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK

def proc_ctxsw(pid):
    """Context switches of every thread of a running process (voluntary + not)."""
    n = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            for line in open(f"/proc/{pid}/task/{tid}/status"):
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    n += int(line.split()[1])
        except OSError:
            pass
    return n

last_client_ctxsw = [0]
def run_client(argv, timeout):
    """Run a pinned client; returns (exit code, stdout, stderr). Its own rusage
    (taskset execs the tool, so it is the tool's) is kept in last_client_ctxsw."""
    p = subprocess.Popen(pin(CCPU, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=DEVNULL, text=True)
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err

servers = []
def start_server(argv):
    p = subprocess.Popen(pin(SCPU, argv), stdout=DEVNULL, stderr=DEVNULL, stdin=DEVNULL)
    servers.append(p)
    return p

def stop_servers():
    for p in servers:
        if p.poll() is None:
            p.terminate()
    for p in servers:
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()

def wait_port(port):
    import socket
    for _ in range(200):
        try:
            socket.create_connection((HOST, port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"compare.sh: nothing listens on {port}")

def measured(server, argv):
    """Run one client against a long-running server; CPU of both sides."""
    s0, x0 = proc_cpu(server.pid), proc_ctxsw(server.pid)
    r0 = os.times()
    u0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    rc, out, err = run_client(argv, DURATION * 4 + 60)
    u1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    r1 = os.times()
    s1, x1 = proc_cpu(server.pid), proc_ctxsw(server.pid)
    # context switches per operation hardly depend on the machine's load
    last_client_ctxsw[0] = (u1.ru_nvcsw + u1.ru_nivcsw) - (u0.ru_nvcsw + u0.ru_nivcsw), x1 - x0
    return rc, out, err, (r1.children_user - r0.children_user) + (r1.children_system - r0.children_system), s1 - s0

def netload_rr(srv):
    rc, out, err, ccpu, scpu = measured(srv, [NETLOAD, "run", "--workload", "rr1c-1x1--1", "--duration", f"{DURATION}s",
                                             "--remote", f"{HOST}:{NL_PORT}", "--json", "-q"])
    if rc != 0:
        sys.exit(f"compare.sh: netload rr1c-1x1--1 failed: {err.strip()}")
    d = json.loads(out); s = d["summary"]
    n = s["transactions"]
    cc, sc = last_client_ctxsw[0]
    return {"tps": s["transactions_per_s"], "p50_us": s["txn_time_ns"]["p50"] / 1e3, "p99_us": s["txn_time_ns"]["p99"] / 1e3,
            "p99_9_us": s["txn_time_ns"]["p99_9"] / 1e3, "client_cpu_us_per_txn": ccpu * 1e6 / n, "server_cpu_us_per_txn": scpu * 1e6 / n,
            "client_ctxsw_per_txn": cc / n, "server_ctxsw_per_txn": sc / n}

def sockperf_rr(srv):
    rc, out, err, ccpu, scpu = measured(srv, ["sockperf", "pp", "--tcp", "-i", HOST, "-p", str(SP_PORT), "-m", "14", "-t", str(DURATION)])
    txt = out + err
    m = re.search(r"\[Valid Duration\] RunTime=([\d.]+) sec; SentMessages=(\d+); ReceivedMessages=(\d+)", txt)
    if rc != 0 or not m:
        sys.exit(f"compare.sh: sockperf failed: {txt[-300:]}")
    total = re.search(r"\[Total Run\].*SentMessages=(\d+)", txt)
    n = int(total.group(1)) if total else int(m.group(2))
    pct = {k: float(v) for k, v in re.findall(r"percentile\s+([\d.]+)\s*=\s*([\d.]+)", txt)}
    # sockperf reports half the round trip: double it to compare with a transaction
    cc, sc = last_client_ctxsw[0]
    return {"tps": int(m.group(3)) / float(m.group(1)), "p50_us": 2 * pct["50.000"], "p99_us": 2 * pct["99.000"],
            "p99_9_us": 2 * pct["99.900"], "client_cpu_us_per_txn": ccpu * 1e6 / n, "server_cpu_us_per_txn": scpu * 1e6 / n,
            "client_ctxsw_per_txn": cc / n, "server_ctxsw_per_txn": sc / n}

def netload_stream(srv):
    rc, out, err, ccpu, scpu = measured(srv, [NETLOAD, "run", "--workload", "str-writex30k--1", "--duration", f"{DURATION}s",
                                             "--remote", f"{HOST}:{NL_PORT}", "--json", "-q"])
    if rc != 0:
        sys.exit(f"compare.sh: netload str-writex30k--1 failed: {err.strip()}")
    s = json.loads(out)["summary"]
    gb = s["bytes"] / 1e9
    return {"gbps": s["throughput_bits_per_s"] / 1e9, "client_cpu_s_per_gb": ccpu / gb, "server_cpu_s_per_gb": scpu / gb}

def iperf3_stream(srv):
    rc, out, err, ccpu, scpu = measured(srv, ["iperf3", "-c", HOST, "-p", str(IP_PORT), "-l", "30720", "-t", str(DURATION), "-J"])
    if rc != 0:
        sys.exit(f"compare.sh: iperf3 failed: {(out + err)[-300:]}")
    e = json.loads(out)["end"]["sum_received"]
    gb = e["bytes"] / 1e9  # the client also spends CPU on its 0.5-1 s of setup; counted, as for netload
    return {"gbps": e["bits_per_second"] / 1e9, "client_cpu_s_per_gb": ccpu / gb, "server_cpu_s_per_gb": scpu / gb}

def vmhwm_run(workload):
    port = NL_PORT + 10
    srv = subprocess.Popen(pin(SCPU, [NETLOAD, "serve", "--listen", f"{HOST}:{port}", "--once", "-q"]),
                           stdout=DEVNULL, stderr=DEVNULL, stdin=DEVNULL)
    servers.append(srv)
    wait_port(port)
    rc, out, err = run_client([NETLOAD, "run", "--workload", workload, "--duration", f"{DURATION}s", "--remote", f"{HOST}:{port}", "--json", "-q"],
                              DURATION * 4 + 60)
    srv.wait(30)
    if not out.strip():
        return {"error": err.strip()}
    d = json.loads(out); s = d["summary"]
    return {"exit": rc, "errors": s["errors"], "server_errors": s["server_errors"], "transactions_per_s": s["transactions_per_s"],
            "gbps": s["throughput_bits_per_s"] / 1e9, "p99_us": s["txn_time_ns"]["p99"] / 1e3,
            "client_peak_mib": d["peak_rss_bytes"]["client"] / 2**20, "server_peak_mib": d["peak_rss_bytes"]["server"] / 2**20}

signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
try:
    nl = start_server([NETLOAD, "serve", "--listen", f"{HOST}:{NL_PORT}", "-q"])
    sp = start_server(["sockperf", "sr", "--tcp", "-i", HOST, "-p", str(SP_PORT)])
    ip = start_server(["iperf3", "-s", "-p", str(IP_PORT), "-B", HOST])
    wait_port(NL_PORT); wait_port(SP_PORT); time.sleep(0.5)  # iperf3: no probe (it would count it as a test)
    rounds = []
    print(f"== {ROUNDS} rounds of {DURATION}s; client on CPU {CCPU}, server on CPU {SCPU}; {os.cpu_count()} CPUs; tools take turns", flush=True)
    for r in range(ROUNDS):
        row = {"load_average_1m": os.getloadavg()[0]}
        rr = [("netload_rr", lambda: netload_rr(nl)), ("sockperf", lambda: sockperf_rr(sp))]
        stream = [("netload_stream", lambda: netload_stream(nl)), ("iperf3", lambda: iperf3_stream(ip))]
        order = rr + stream if r % 2 == 0 else rr[::-1] + stream[::-1]
        for name, fn in order:
            row[name] = fn()
        rounds.append(row)
        print(f"   round {r + 1}: load average {row['load_average_1m']:.2f}; netload {row['netload_rr']['tps']:.0f} txn/s, "
              f"sockperf {row['sockperf']['tps']:.0f}; netload {row['netload_stream']['gbps']:.2f} Gb/s, iperf3 {row['iperf3']['gbps']:.2f}", flush=True)
    users250 = {w: vmhwm_run(w) for w in ("rr1c-1x1--250", "str-readx30k--250")}
finally:
    stop_servers()

def ratios(a, b, key, combine=None):
    out = []
    for row in rounds:
        x, y = row[a], row[b]
        if combine:
            out.append(sum(x[k] for k in combine) / sum(y[k] for k in combine))
        else:
            out.append(x[key] / y[key])
    return {"median": statistics.median(out), "min": min(out), "max": max(out), "rounds": out}

summary = {
    "rr_tps": ratios("netload_rr", "sockperf", "tps"),
    "rr_cpu_per_txn_client": ratios("netload_rr", "sockperf", "client_cpu_us_per_txn"),
    "rr_cpu_per_txn_server": ratios("netload_rr", "sockperf", "server_cpu_us_per_txn"),
    "rr_cpu_per_txn_total": ratios("netload_rr", "sockperf", None, ("client_cpu_us_per_txn", "server_cpu_us_per_txn")),
    "rr_p99": ratios("netload_rr", "sockperf", "p99_us"),
    "rr_ctxsw_client": ratios("netload_rr", "sockperf", "client_ctxsw_per_txn"),
    "rr_ctxsw_server": ratios("netload_rr", "sockperf", "server_ctxsw_per_txn"),
    "stream_throughput": ratios("netload_stream", "iperf3", "gbps"),
    "stream_cpu_per_gb_client": ratios("netload_stream", "iperf3", "client_cpu_s_per_gb"),
    "stream_cpu_per_gb_server": ratios("netload_stream", "iperf3", "server_cpu_s_per_gb"),
    "stream_cpu_per_gb_total": ratios("netload_stream", "iperf3", None, ("client_cpu_s_per_gb", "server_cpu_s_per_gb")),
}
med = lambda tool, key: statistics.median(row[tool][key] for row in rounds)
res = {"host": platform.node(), "kernel": platform.release(), "ncpu": os.cpu_count(), "rounds": ROUNDS, "duration_s": DURATION,
       "client_cpu": CCPU, "server_cpu": SCPU, "netload": NETLOAD,
       "gomaxprocs": os.environ.get("GOMAXPROCS") or "netload's own choice: with one user in blocking I/O, 2 (the strand's P and a spare)",
       "load_average_1m": [row["load_average_1m"] for row in rounds], "per_round": rounds, "ratios": summary, "users250": users250}
os.makedirs(os.path.dirname(OUT), exist_ok=True)
json.dump(res, open(OUT, "w"), indent=2)

L = res["load_average_1m"]
print(f"\n{os.cpu_count()} CPUs; load average (1 min) per round: {' '.join(f'{x:.2f}' for x in L)}")
print(f"{'metric':44s} {'netload':>10s} {'peer':>10s}   netload:peer per round, median (spread)")
def line(label, a, b, key, unit, fmt, rkey):
    s = summary[rkey]
    print(f"{label:44s} {fmt.format(med(a, key)):>10s} {fmt.format(med(b, key)):>10s}   {s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f}) {unit}")
line("rr1c-1x1--1 txn/s vs sockperf pp -m 14", "netload_rr", "sockperf", "tps", "", "{:.0f}", "rr_tps")
line("  CPU per transaction, client (us)", "netload_rr", "sockperf", "client_cpu_us_per_txn", "", "{:.2f}", "rr_cpu_per_txn_client")
line("  CPU per transaction, server (us)", "netload_rr", "sockperf", "server_cpu_us_per_txn", "", "{:.2f}", "rr_cpu_per_txn_server")
s = summary["rr_cpu_per_txn_total"]
print(f"{'  CPU per transaction, client + server':44s} {'':>10s} {'':>10s}   {s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})")
line("  transaction time p99 (us)", "netload_rr", "sockperf", "p99_us", "", "{:.1f}", "rr_p99")
line("  context switches per transaction, client", "netload_rr", "sockperf", "client_ctxsw_per_txn", "", "{:.2f}", "rr_ctxsw_client")
line("  context switches per transaction, server", "netload_rr", "sockperf", "server_ctxsw_per_txn", "", "{:.2f}", "rr_ctxsw_server")
print(f"{'  p50 / p99.9 (us)':44s} {med('netload_rr', 'p50_us'):.1f}/{med('netload_rr', 'p99_9_us'):.0f}  {med('sockperf', 'p50_us'):.1f}/{med('sockperf', 'p99_9_us'):.0f}")
line("str-writex30k--1 Gb/s vs iperf3 -l 30720", "netload_stream", "iperf3", "gbps", "", "{:.2f}", "stream_throughput")
line("  CPU-s per GB, client", "netload_stream", "iperf3", "client_cpu_s_per_gb", "", "{:.3f}", "stream_cpu_per_gb_client")
line("  CPU-s per GB, server", "netload_stream", "iperf3", "server_cpu_s_per_gb", "", "{:.3f}", "stream_cpu_per_gb_server")
s = summary["stream_cpu_per_gb_total"]
print(f"{'  CPU-s per GB, client + server':44s} {'':>10s} {'':>10s}   {s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})")
for w, v in users250.items():
    if "error" in v:
        print(f"{w}: {v['error']}"); continue
    print(f"{w}: exit {v['exit']}, errors {v['errors']}/{v['server_errors']}, {v['transactions_per_s']:.0f} txn/s, {v['gbps']:.2f} Gb/s, "
          f"p99 {v['p99_us']:.0f} us, peak RSS client {v['client_peak_mib']:.1f} MiB, server {v['server_peak_mib']:.1f} MiB")
print(f"written to {OUT}")
PY
