#!/usr/bin/env bash
# Compare netload with sockperf (TCP ping-pong) and iperf3 (TCP stream) on
# loopback, and measure peak memory of 250-user runs.
#
#   bench/netload/compare.sh            # defaults: 5 s per run, 3 rounds
#   DURATION=10 ROUNDS=5 bench/netload/compare.sh
#
# Needs: netload built (netload/bin/netload, `make -C netload build`),
# sockperf, iperf3, python3. Traffic stays on 127.0.0.1; every process
# started here is stopped on exit. Results: a table on stdout and a JSON
# file (OUT, default bench/netload/results/latest.json).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
NETLOAD=${NETLOAD:-$root/netload/bin/netload}
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-$here/results/latest.json}
HOST=127.0.0.1
NL_PORT=${NL_PORT:-20931}
SP_PORT=${SP_PORT:-20932}
IP_PORT=${IP_PORT:-20933}
SP_SIZE=14 # sockperf's smallest message

for tool in "$NETLOAD" sockperf iperf3 python3; do
  command -v "$tool" >/dev/null || { echo "compare.sh: $tool not found" >&2; exit 2; }
done

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

wait_port() { # wait until something listens on $1
  for _ in $(seq 100); do
    if (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  echo "compare.sh: nothing listens on $1" >&2; return 1
}

# servers: netload, sockperf, iperf3
"$NETLOAD" serve --listen "$HOST:$NL_PORT" -q >"$work/nl-serve.log" 2>&1 &
pids+=($!)
sockperf sr --tcp -i "$HOST" -p "$SP_PORT" >"$work/sp-serve.log" 2>&1 &
sp_pid=$!
pids+=($!)
iperf3 -s -p "$IP_PORT" -B "$HOST" >"$work/ip-serve.log" 2>&1 &
pids+=($!)
wait_port "$NL_PORT"; wait_port "$SP_PORT"
sleep 0.5 # iperf3: no probe connection (it would take it for a test)

nl_run() { # name args... -> JSON document in $work/name.json
  local name=$1; shift
  "$NETLOAD" run --remote "$HOST:$NL_PORT" --json -q "$@" >"$work/$name.json"
}

echo "== round-robin: ${ROUNDS} rounds of ${DURATION}s each (netload and the reference take turns)"
# The machine may be shared: every round runs netload and the reference
# back to back (alternating which goes first), and the summary uses the
# ratio within each round as well as medians over rounds.
proc_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
sp_run() {
  local t0; t0=$(proc_ticks "$sp_pid")
  /usr/bin/time -f "CPU %U %S" -o "$work/sp-time-$1.txt" \
    sockperf pp --tcp -i "$HOST" -p "$SP_PORT" -m "$SP_SIZE" -t "$DURATION" >"$work/sp-$1.txt" 2>&1
  echo "$(( $(proc_ticks "$sp_pid") - t0 ))" >"$work/sp-srvticks-$1.txt"
}
ip_run() { iperf3 -c "$HOST" -p "$IP_PORT" -l 30720 -t "$DURATION" -J >"$work/ip-$1.json"; }
for r in $(seq "$ROUNDS"); do
  cut -d' ' -f1 /proc/loadavg >"$work/load-$r.txt"
  if ((r % 2)); then
    nl_run "rr1x1-$r" --workload rr1c-1x1--1 --duration "${DURATION}s"
    nl_run "rr14-$r" --workload rr1c-14x14--1 --duration "${DURATION}s"
    sp_run "$r"
    nl_run "strw-$r" --workload str-writex30k--1 --duration "${DURATION}s"
    ip_run "$r"
  else
    sp_run "$r"
    nl_run "rr14-$r" --workload rr1c-14x14--1 --duration "${DURATION}s"
    nl_run "rr1x1-$r" --workload rr1c-1x1--1 --duration "${DURATION}s"
    ip_run "$r"
    nl_run "strw-$r" --workload str-writex30k--1 --duration "${DURATION}s"
  fi
  echo "   round $r done (load average $(cat "$work/load-$r.txt"))"
done

echo "== 250 users (peak memory of each side)"
for w in rr1c-1x1--250 str-readx30k--250; do
  # a fresh server per workload, so its VmHWM belongs to this run alone
  port=$((NL_PORT + 10))
  /usr/bin/time -v "$NETLOAD" serve --listen "$HOST:$port" --once -q >/dev/null 2>"$work/time-serve-$w.txt" &
  spid=$!
  wait_port "$port"
  /usr/bin/time -v "$NETLOAD" run --workload "$w" --duration "${DURATION}s" --remote "$HOST:$port" --json -q \
    >"$work/u250-$w.json" 2>"$work/time-run-$w.txt" || true
  wait "$spid" || true
done

python3 - "$work" "$ROUNDS" "$OUT" <<'PY'
import json, os, re, statistics, sys, platform
work, rounds, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def load(n): return json.load(open(os.path.join(work, n)))
def med(v): return statistics.median(v) if v else float("nan")
res = {"rounds": rounds, "host": platform.node(), "kernel": platform.release(), "ncpu": os.cpu_count()}
nl_tps, nl14_tps, sp_tps, nl_bps, ip_bps = [], [], [], [], []
nl_lat, sp_lat = [], []
nl_cpu_txn, sp_cpu_txn, nl_cpu_gb, ip_cpu_gb = [], [], [], []
for r in range(1, rounds + 1):
    d = load(f"rr1x1-{r}.json"); s = d["summary"]
    nl_tps.append(s["transactions_per_s"]); nl_lat.append(s["txn_time_ns"])
    nl14_tps.append(load(f"rr14-{r}.json")["summary"]["transactions_per_s"])
    txt = open(os.path.join(work, f"sp-{r}.txt")).read()
    m = re.search(r"\[Valid Duration\] RunTime=([\d.]+) sec; SentMessages=(\d+); ReceivedMessages=(\d+)", txt)
    sp_tps.append(int(m.group(3)) / float(m.group(1)))
    pct = {k: float(v) for k, v in re.findall(r"percentile\s+([\d.]+)\s*=\s*([\d.]+)", txt)}
    mx = float(re.search(r"<MAX> observation =\s*([\d.]+)", txt).group(1))
    mn = float(re.search(r"<MIN> observation =\s*([\d.]+)", txt).group(1))
    avg = float(re.search(r"avg-latency=([\d.]+)", txt).group(1))
    # sockperf prints half the round trip by default: double it to compare with a transaction
    sp_lat.append({"avg": 2*avg, "min": 2*mn, "p50": 2*pct["50.000"], "p90": 2*pct["90.000"], "p99": 2*pct["99.000"], "p99_9": 2*pct["99.900"], "max": 2*mx})
    nl_cpu_txn.append((d["cpu"]["client"]["process_cpu_us_per_txn"], d["cpu"]["server"]["process_cpu_us_per_txn"]))
    total = re.search(r"\[Total Run\].*SentMessages=(\d+)", txt)
    u, s_ = map(float, re.search(r"CPU ([\d.]+) ([\d.]+)", open(os.path.join(work, f"sp-time-{r}.txt")).read()).groups())
    srv_s = int(open(os.path.join(work, f"sp-srvticks-{r}.txt")).read()) / 100
    n = int(total.group(1)) if total else int(m.group(2))
    sp_cpu_txn.append(((u + s_) * 1e6 / n, srv_s * 1e6 / n))
    dw = load(f"strw-{r}.json")
    nl_bps.append(dw["summary"]["throughput_bits_per_s"])
    gb = dw["summary"]["bytes"] / 1e9
    nl_cpu_gb.append((dw["cpu"]["client"]["process_cpu_s"] / gb, dw["cpu"]["server"]["process_cpu_s"] / gb))
    ip = load(f"ip-{r}.json")
    ip_bps.append(ip["end"]["sum_received"]["bits_per_second"])
    secs = ip["end"]["sum_received"]["seconds"]; igb = ip["end"]["sum_received"]["bytes"] / 1e9
    cu = ip["end"]["cpu_utilization_percent"]
    ip_cpu_gb.append((cu["host_total"] / 100 * secs / igb, cu["remote_total"] / 100 * secs / igb))
def lat_med(rows, key, scale):
    return med([row[key] * scale for row in rows])
keys = ["avg", "min", "p50", "p90", "p99", "p99_9", "max"]
loads = [float(open(os.path.join(work, f"load-{r}.txt")).read()) for r in range(1, rounds + 1)]
res["load_average_1m"] = loads
pair = lambda a, b: [x / y for x, y in zip(a, b)]
res["rr"] = {
    "netload_rr1c-1x1_tps": nl_tps, "netload_rr1c-14x14_tps": nl14_tps, "sockperf_pp_14B_tps": sp_tps,
    "ratio_1x1_vs_sockperf": med(nl_tps) / med(sp_tps), "ratio_14x14_vs_sockperf": med(nl14_tps) / med(sp_tps),
    "round_ratios_1x1": pair(nl_tps, sp_tps), "round_ratios_14x14": pair(nl14_tps, sp_tps),
    "netload_txn_time_us": {k: lat_med(nl_lat, k, 1e-3) for k in keys},
    "sockperf_rtt_us": {k: lat_med(sp_lat, k, 1) for k in keys},
}
pm = lambda rows, i: med([row[i] for row in rows])
res["rr"]["cpu_us_per_txn"] = {"netload_client": pm(nl_cpu_txn, 0), "netload_server": pm(nl_cpu_txn, 1),
                               "sockperf_client": pm(sp_cpu_txn, 0), "sockperf_server": pm(sp_cpu_txn, 1)}
res["stream_cpu_s_per_gb"] = {"netload_client": pm(nl_cpu_gb, 0), "netload_server": pm(nl_cpu_gb, 1),
                              "iperf3_client": pm(ip_cpu_gb, 0), "iperf3_server": pm(ip_cpu_gb, 1)}
res["stream"] = {"netload_str-writex30k_bps": nl_bps, "iperf3_l30720_bps": ip_bps, "ratio": med(nl_bps) / med(ip_bps),
                 "round_ratios": pair(nl_bps, ip_bps)}
def hwm(path):
    t = open(path).read()
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", t)
    return int(m.group(1)) * 1024 if m else None
res["users250"] = {}
for w in ["rr1c-1x1--250", "str-readx30k--250"]:
    try:
        d = load(f"u250-{w}.json")
    except Exception as e:
        res["users250"][w] = {"error": str(e)}; continue
    res["users250"][w] = {
        "errors": d["summary"]["errors"], "error": d["error"], "transactions_per_s": d["summary"]["transactions_per_s"],
        "throughput_bits_per_s": d["summary"]["throughput_bits_per_s"],
        "txn_time_us_p99": d["summary"]["txn_time_ns"]["p99"] / 1e3,
        "client_vmhwm_bytes": d["peak_rss_bytes"]["client"], "server_vmhwm_bytes": d["peak_rss_bytes"]["server"],
        "client_time_v_maxrss_bytes": hwm(os.path.join(work, f"time-run-{w}.txt")),
        "server_time_v_maxrss_bytes": hwm(os.path.join(work, f"time-serve-{w}.txt")),
    }
os.makedirs(os.path.dirname(out), exist_ok=True)
json.dump(res, open(out, "w"), indent=2)
rr, st = res["rr"], res["stream"]
rr1 = res["rr"]["round_ratios_1x1"]; r14 = res["rr"]["round_ratios_14x14"]; sr = res["stream"]["round_ratios"]
print(f"\nload average during the rounds: {' '.join(f'{l:.1f}' for l in loads)}")
print(f"\nRequest/response, 1 user, loopback (median of {rounds} runs)")
print(f"  netload rr1c-1x1--1    {med(nl_tps):10.0f} txn/s   ({rr['ratio_1x1_vs_sockperf']:.2f}x sockperf)")
print(f"  netload rr1c-14x14--1  {med(nl14_tps):10.0f} txn/s   ({rr['ratio_14x14_vs_sockperf']:.2f}x sockperf)")
print(f"  sockperf pp --tcp -m14 {med(sp_tps):10.0f} txn/s")
print(f"  per-round ratio 1x1/sockperf: median {med(rr1):.2f} (min {min(rr1):.2f}, max {max(rr1):.2f}); 14x14: median {med(r14):.2f} (min {min(r14):.2f}, max {max(r14):.2f})")
print("  transaction time / round trip (us):   " + "  ".join(f"{k:>6}" for k in keys))
print("    netload rr1c-1x1                    " + "  ".join(f"{rr['netload_txn_time_us'][k]:6.1f}" for k in keys))
print("    sockperf (2 x its one-way figure)   " + "  ".join(f"{rr['sockperf_rtt_us'][k]:6.1f}" for k in keys))
c = res["rr"]["cpu_us_per_txn"]
print(f"  CPU per transaction (us): netload client {c['netload_client']:.1f} server {c['netload_server']:.1f};"
      f" sockperf client {c['sockperf_client']:.1f} server {c['sockperf_server']:.1f}")
print(f"\nStream, 30 KiB writes, 1 connection")
print(f"  netload str-writex30k--1 {med(nl_bps)/1e9:8.2f} Gb/s   ({st['ratio']:.2f}x iperf3)")
print(f"  iperf3 -l 30720          {med(ip_bps)/1e9:8.2f} Gb/s (receiver)")
print(f"  per-round ratio: median {med(sr):.2f} (min {min(sr):.2f}, max {max(sr):.2f})")
c = res["stream_cpu_s_per_gb"]
print(f"  CPU-s per GB: netload client {c['netload_client']:.3f} server {c['netload_server']:.3f};"
      f" iperf3 client {c['iperf3_client']:.3f} server {c['iperf3_server']:.3f}")
print("\n250 users")
for w, v in res["users250"].items():
    if "client_vmhwm_bytes" not in v:
        print(f"  {w}: {v}"); continue
    print(f"  {w:18s} errors {v['errors']}  {v['transactions_per_s']:9.0f} txn/s  {v['throughput_bits_per_s']/1e9:6.2f} Gb/s"
          f"  peak RSS client {v['client_vmhwm_bytes']/2**20:.1f} MiB, server {v['server_vmhwm_bytes']/2**20:.1f} MiB")
print(f"\nwritten to {out}")
PY
