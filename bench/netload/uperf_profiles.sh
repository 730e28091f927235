#!/usr/bin/env bash
# Runs every profile of a uperf source tree (workloads/, tests/, manual/)
# unchanged against real `netload serve`s on loopback and sorts each into
#   ok           ran to its end with no error
#   unsupported  refused in one line for a feature netload lists as unsupported
#                (SCTP, SSL, vsock, RDS, uDAPL, sendfile, localhost, ...)
#   bad-profile  refused in one line because the file itself is broken
#                (malformed XML, a misspelt element, the manual's own text)
#   failed       anything else: what issue 16 asks to be none
#
#   bench/netload/uperf_profiles.sh /path/to/uperf
#   DURATION=2s LONG=1 bench/netload/uperf_profiles.sh /path/to/uperf
#
# uperf's variables come from the environment as uperf takes them: $h is the
# first server, $h1..$h4 four servers on 127.0.0.1..127.0.0.4 (loopback, one
# `netload serve` each), $proto=tcp, $nthr=$nprocs=$nth=$conn=2 (users),
# $iter=100, $dur=DURATION.
# Timed transactions run for DURATION (default 1s). oltpnet.xml (10^6
# transactions of 1,000 users, minutes) runs only with LONG=1.
# Results: a line per profile and a summary on stdout, JSON in OUT (default
# results/uperf-profiles.json next to this script).
set -euo pipefail
src=${1:?usage: uperf_profiles.sh UPERF_SOURCE_TREE}
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "${NETLOAD:-}" ]; then
  for c in "$here/netload" "$here/../../netload/bin/netload" "$(command -v netload || true)"; do
    if [ -n "$c" ] && [ -x "$c" ]; then NETLOAD=$c; break; fi
  done
fi
[ -x "${NETLOAD:-}" ] || { echo "uperf_profiles.sh: netload not found (make -C netload build, or set NETLOAD)" >&2; exit 2; }
for d in workloads tests manual; do
  [ -d "$src/$d" ] || { echo "uperf_profiles.sh: $src/$d: not a directory (give uperf's source tree)" >&2; exit 2; }
done
export NETLOAD SRC="$src" HERE="$here"
exec python3 - <<'PY'
import glob, json, os, re, subprocess, sys, time
NETLOAD, SRC = os.environ["NETLOAD"], os.environ["SRC"]
DURATION = os.environ.get("DURATION", "1s")
LONG = os.environ.get("LONG") == "1"
OUT = os.environ.get("OUT", os.path.join(os.environ["HERE"], "results", "uperf-profiles.json"))
PORT = int(os.environ.get("PORT", "20941"))
HOSTS = [f"127.0.0.{i}:{PORT}" for i in range(1, 5)]
# what netload refuses on purpose (its README, "Not supported"), and the
# files uperf ships broken or as documentation
UNSUPPORTED = re.compile(r"is not supported by netload|unknown protocol \"(udapl|XXX)\"")
BROKEN = re.compile(r"malformed XML|unknown element <(goup|article)>")

servers = [subprocess.Popen([NETLOAD, "serve", "--listen", h, "-q"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL) for h in HOSTS]
try:
    time.sleep(0.5)
    for s in servers:
        if s.poll() is not None:
            sys.exit(f"uperf_profiles.sh: netload serve exited ({s.args[-2]})")
    # dns.xml takes its users from $conn, rdstest.xml from $nth and $host1
    env = dict(os.environ, h=HOSTS[0], h1=HOSTS[0], h2=HOSTS[1], h3=HOSTS[2], h4=HOSTS[3], host1=HOSTS[0],
               hostlo1="127.0.0.1", proto="tcp", nthr="2", nprocs="2", nth="2", conn="2", iter="100", dur=DURATION)
    rows = []
    for path in sorted(glob.glob(os.path.join(SRC, "*", "*.xml"))):
        rel = os.path.relpath(path, SRC)
        if rel.split(os.sep)[0] not in ("workloads", "tests", "manual"):
            continue
        if os.path.basename(path) == "oltpnet.xml" and not LONG:
            rows.append({"profile": rel, "result": "skipped", "why": "10^6 transactions of 1,000 users: LONG=1"})
            print(f"{'skipped':12s} {rel}", flush=True)
            continue
        t0 = time.monotonic()
        p = subprocess.run([NETLOAD, "run", path, "--duration", DURATION, "-q", "--stall-timeout", "20s"],
                           env=env, capture_output=True, text=True, timeout=3600 if LONG else 300)
        first = next((ln for ln in p.stderr.splitlines() if "warning:" not in ln), "")
        warnings = [ln for ln in p.stderr.splitlines() if "warning:" in ln]
        if p.returncode == 0:
            result = "ok"
        elif p.returncode == 2 and UNSUPPORTED.search(first):
            result = "unsupported"
        elif p.returncode == 2 and BROKEN.search(first):
            result = "bad-profile"
        else:
            result = "failed"
        # netload quotes what it takes from a profile; escape the rest anyway: the files are not ours
        why = first.replace(SRC + os.sep, "")[:300].encode("unicode_escape").decode("ascii")
        rows.append({"profile": rel, "result": result, "exit": p.returncode, "seconds": round(time.monotonic() - t0, 2),
                     "message": why, "warnings": len(warnings)})
        print(f"{result:12s} {rel}  {why}", flush=True)
finally:
    for s in servers:
        s.terminate()
    for s in servers:
        try:
            s.wait(5)
        except subprocess.TimeoutExpired:
            s.kill()
count = {k: sum(r["result"] == k for r in rows) for k in ("ok", "unsupported", "bad-profile", "failed", "skipped")}
print(f"\n{len(rows)} profiles: " + ", ".join(f"{v} {k}" for k, v in count.items()))
os.makedirs(os.path.dirname(OUT), exist_ok=True)
json.dump({"uperf_source": SRC, "duration": DURATION, "netload": subprocess.run([NETLOAD, "version"], capture_output=True,
           text=True).stdout.strip(), "summary": count, "profiles": rows}, open(OUT, "w"), indent=2)
print(f"written to {OUT}")
sys.exit(1 if count["failed"] else 0)
PY
