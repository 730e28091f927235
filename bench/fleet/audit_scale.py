"""`kvmtune audit -c URI` of a libvirt holding many defined domains, against the floor: one process that
lists the domains through libvirt's API, fetches each one's XML and parses it with lxml.

Goal (issue 21): at most 2x the floor's wall time and at most 100 MB peak memory at 1,000 domains; then
10,000 to show how the cost grows. The domains live in libvirt's test driver (`test:///FILE`, a node
file written here from the bundled example domains, round-robin, each renamed): the real libvirt API
and XML, without a daemon, so nothing on this host changes. `--uri qemu:///system` measures a live
libvirtd instead (define the domains there yourself first).

Each side runs in a fresh process, alternating, `--rounds` times; wall time and peak RSS come from
/usr/bin/time. Run: .venv/bin/python bench/fleet/audit_scale.py [--domains 1000 10000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "src" / "kvmtune" / "examples").glob("*.xml"))
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


def node_file(path: Path, count: int) -> None:
    bodies = [re.sub(r"<\?xml[^>]*>", "", p.read_text()) for p in EXAMPLES]
    with open(path, "w") as fh:
        fh.write("<node>\n")
        for i in range(count):
            body = re.sub(r"<name>[^<]*</name>", f"<name>vm{i:06d}</name>", bodies[i % len(bodies)], count=1)
            fh.write(re.sub(r"<uuid>[^<]*</uuid>", "", body))
        fh.write("</node>\n")


def timed(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one fresh process."""
    # an installed kvmtune has its bytecode compiled (pip does it); do not time the compiler
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out = subprocess.run(["/usr/bin/time", "-f", "KVMTUNE-TIME %e %M", *argv], capture_output=True, text=True, env=env)
    line = [x for x in out.stderr.splitlines() if x.startswith("KVMTUNE-TIME")][-1]
    _, wall, rss_kib = line.split()
    if out.returncode not in (0, 1):
        raise SystemExit(f"{argv[0]} exited {out.returncode}: {out.stderr[-500:]}")
    return float(wall), int(rss_kib) / 1024


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--domains", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--uri", help="measure this libvirt instead of a generated test-driver node file")
    args = ap.parse_args()
    kvmtune = str(REPO / ".venv" / "bin" / "kvmtune")
    py = "/usr/bin/python3"  # Debian's, which has python3-libvirt and python3-lxml
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for count in args.domains if args.uri is None else [0]:
            uri = args.uri
            if uri is None:
                node = Path(tmp) / f"node-{count}.xml"
                node_file(node, count)
                uri = f"test://{node}"
            floor, ours = [], []
            timed([kvmtune, "rules", "list"])  # warm-up: writes the bytecode once
            for _ in range(args.rounds):
                floor.append(timed([py, "-c", FLOOR, uri]))
                ours.append(timed([kvmtune, "audit", "-c", uri, "--format", "json", "-o", os.devnull]))
            fw, kw = statistics.median(w for w, _ in floor), statistics.median(w for w, _ in ours)
            results.append({
                "domains": count or "as defined", "uri": "test driver" if args.uri is None else uri,
                "floor_wall_s": round(fw, 2), "kvmtune_wall_s": round(kw, 2), "ratio": round(kw / fw, 2),
                "ratios_per_round": [round(o[0] / f[0], 2) for f, o in zip(floor, ours, strict=True)],
                "floor_peak_mib": round(max(r for _, r in floor), 1), "kvmtune_peak_mib": round(max(r for _, r in ours), 1),
                "cores": os.cpu_count(), "loadavg_1m": round(os.getloadavg()[0], 2),
            })
            print(json.dumps(results[-1]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
