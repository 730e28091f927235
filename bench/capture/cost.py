"""What ``kvmtune capture`` costs the guest it records: the probe guest's IOPS with and without a capture running.

Boots the probe guest with ``kvmtune guest run --load disk --job JOB`` (``--pin CPUS`` passed on) and measures, round
after round, its IOPS over --seconds with one counter for every side: QEMU's own ``query-blockstats`` (read plus
write operations). Each round is: uncaptured, ``--source blockstats``, uncaptured, ``--source trace``, uncaptured (the
order of the two sources alternates round by round), so every capture window has an uncaptured window on each side;
a capture's IOPS is the blockstats delta over its own active window (events on, 1 Hz reads running: the figure the
capture records itself), taken by running kvmtune's capture (:class:`kvmtune.capture.session.Capture`, what
``kvmtune capture`` runs) in this process. Its ratio to the mean of the two uncaptured windows beside it is one
round's figure; per source the 95 % interval of the ratio (Student's t on the logarithms of the per-round ratios,
docs/verdicts.md) is judged against the issue's bound: at least 0.99 with statistics, 0.95 with trace events.

The trace capture's own request count is not used: its events run from the moment they are switched on until they
are switched off, a little longer than its blockstats interval, so it counts a few requests more than the window holds
(its earlier use made trace capture look faster than no capture at all).

Holds the measuring lock for the whole run, guest boot included, so run it plain (an outer
``flock /tmp/kvmtune-measure.lock`` would wait on itself): ``python bench/capture/cost.py --rounds 10 --seconds 10``.
Prints the CPU count, the load average before and after, and the CPU affinity of QEMU and of the capture; under TCG
every figure is an emulation figure. ``--json FILE`` keeps every window.

The capture's own host cost is printed too: this process's CPU time (user + system, ``getrusage``) over each whole
capture (set-up, the 1 Hz reads, reading and parsing QEMU's trace lines, restore) as a share of one host CPU, and
per recorded request in trace mode.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # probe_domain: as the tests run it

from measuring import loadavg, log_interval, measure_lock, spread
from probe_guest import disk_guest

from kvmtune.capture.libvirt import LibvirtGuest
from kvmtune.capture.session import Capture
from kvmtune.host.root import HostRoot
from kvmtune.lab.vocabulary import at_least
from kvmtune.live.sources import Sampler
from kvmtune.live.why import find_target
from kvmtune.qemu.qmp import Qmp

ROOT = Path(__file__).resolve().parents[2]
JOB = "rw=randrw rwmixread=70 bs=4k iodepth=8"
BOUND = {"blockstats": 0.99, "trace": 0.95}  # issue 51: at most 1 % / 5 % of the guest's IOPS


def ops(q: Qmp) -> int:
    st = q.execute("query-blockstats")[0]["stats"]
    return int(st["rd_operations"]) + int(st["wr_operations"])


def connect(qmp_path: Path) -> Qmp:
    """QMP takes one client at a time: the capture that just ended may still hold it for a moment."""
    for _ in range(50):
        try:
            return Qmp(qmp_path, timeout=10)
        except BlockingIOError:
            time.sleep(0.2)
    return Qmp(qmp_path, timeout=10)


@dataclass
class Subject:
    """The guest measured: its QEMU's pid, how to read its disk's total operations from the host, how a capture
    reaches it (``libvirt``: through libvirt, else its own QMP socket) and what one QMP round trip of the capture's
    1 Hz read is."""

    pid: int
    ops: Callable[[], int]
    round_trip: Callable[[], None]
    libvirt: LibvirtGuest | None = None


def uncaptured(subject: Subject, seconds: float) -> float:
    a, t0 = subject.ops(), time.monotonic()
    time.sleep(seconds)
    b, t1 = subject.ops(), time.monotonic()
    return (b - a) / (t1 - t0)


def qmp_ops(qmp_path: Path) -> int:
    q = connect(qmp_path)
    try:
        return ops(q)
    finally:
        q.close()


@contextlib.contextmanager
def probe_subject(args: argparse.Namespace, work: Path) -> Iterator[Subject]:
    """The probe guest run by ``kvmtune guest run --load disk`` (its own QMP socket, its stderr a file)."""
    name = f"cost{os.getpid()}"
    with disk_guest(work, name, args.job, ["--pin", args.pin] if args.pin else []) as qmp_path:

        def round_trip() -> None:
            q = connect(qmp_path)
            try:
                ops(q)
            finally:
                q.close()

        yield Subject(qemu_pid(name), lambda: qmp_ops(qmp_path), round_trip)


LIBVIRT_DISKS = """
    <disk type='file' device='disk'><driver name='qemu' type='raw' cache='none' io='native'/>
      <source file='{work}/vda.raw'/><target dev='vda' bus='virtio'/></disk>
    <disk type='file' device='disk'><driver name='qemu' type='raw' cache='none' io='native'/>
      <source file='{work}/vdb.raw'/><target dev='vdb' bus='virtio'/></disk>"""


@contextlib.contextmanager
def libvirt_subject(args: argparse.Namespace, work: Path) -> Iterator[Subject]:
    """The probe guest as a transient libvirt domain (started by ``scripts/services.sh libvirtd-start``'s libvirtd):
    its QMP reached through libvirt, its trace events through virtlogd into its log, as ``kvmtune capture`` of a
    libvirt guest reaches them. ``--pin`` pins its vCPU and emulator threads (cputune)."""
    import libvirt_qemu

    from probe_domain import running_probe_domain

    started = subprocess.run(["bash", str(ROOT / "scripts" / "services.sh"), "libvirtd-start"], check=False,
                             capture_output=True, text=True)
    if started.returncode != 0:
        raise SystemExit(f"libvirtd-start: {started.stderr.strip()}")
    with running_probe_domain(work, args.libvirt, LIBVIRT_DISKS, "vda", "vdb", args.job, iops=None,
                              prefix="kvmtune-cost") as (name, dom, _):
        if args.pin:
            pins = pin_set(args.pin)
            cpus = [c in pins for c in range(os.cpu_count() or 1)]
            dom.pinVcpu(0, tuple(cpus))
            dom.pinEmulator(tuple(cpus))
        pid = int(Path(f"/run/libvirt/qemu/{name}.pid").read_text().strip())

        def totals() -> int:
            return sum(st[0] + st[2] for st in (dom.blockStats(d) for d in ("vda", "vdb")))  # rd_req + wr_req

        def round_trip() -> None:
            libvirt_qemu.qemuMonitorCommand(dom, json.dumps({"execute": "query-blockstats"}), 0)

        yield Subject(pid, totals, round_trip, LibvirtGuest(args.libvirt, dom.UUIDString(), name))


def pin_set(text: str) -> set[int]:
    """A taskset CPU list (``0``, ``0,1``, ``0-3``) as a set."""
    return {int(c) for part in text.split(",") for c in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)}


@dataclass
class Window:
    iops: float  # the guest's, over the capture's active window
    cpu_s: float  # this process's CPU time (user + system) over the whole capture: the capture's own host cost
    wall_s: float  # the whole capture, set-up and restore included
    requests: int  # requests the capture recorded one by one (0: statistics)


def captured(host: HostRoot, subject: Subject, work: Path, source: str, seconds: float) -> Window:
    """The guest's IOPS over the capture's active window, from the capture's own first and last blockstats, and
    what the capture cost this host's CPU (this process runs nothing else meanwhile)."""
    cap = Capture(host, subject.pid, work, seconds=seconds, trace=source == "trace", require_trace=source == "trace",
                  libvirt=subject.libvirt)
    t0, c0 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
    r = cap.run()
    t1, c1 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
    if source == "trace" and r.requests is None:
        raise SystemExit(f"capture --source trace refused: {r.why_not_trace}")
    cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
    n = sum(len(v) for v in r.requests.values()) if r.requests else 0
    return Window(sum(d.rd_ops + d.wr_ops for d in r.stats.values()) / r.seconds, cpu, t1 - t0, n)


def qmp_round_trips(subject: Subject, count: int) -> list[float]:
    """Seconds each of ``count`` ``query-blockstats`` took, 10 a second, on the running guest: QEMU answers QMP in
    its main loop holding the big lock, which a TCG vCPU (``thread=single``) needs too, so a statistics capture's
    own cost per second is at most one such round trip (plus its histogram set and restore, once each)."""
    took: list[float] = []
    for _ in range(count):
        t0 = time.perf_counter()
        subject.round_trip()
        took.append(time.perf_counter() - t0)
        time.sleep(0.1)
    return took


def qemu_pid(name: str) -> int:
    host = HostRoot("/")
    sampler = Sampler(host, [])
    try:
        target = find_target(host, sampler.snapshot(), name)
    finally:
        sampler.close()
    if target.pid is None:
        raise SystemExit(f"{name}: no QEMU pid")
    return target.pid


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--job", default=JOB)
    ap.add_argument("--pin", help="host CPUs for QEMU (kvmtune guest run --pin), e.g. 1")
    ap.add_argument("--capture-pin", help="host CPUs for this process, the capture (taskset list), e.g. 0")
    ap.add_argument("--json", type=Path, help="write every window's figures here")
    ap.add_argument("--qmp-samples", type=int, default=200,
                    help="after the rounds, time this many query-blockstats round trips (0: none)")
    ap.add_argument("--workdir", type=Path, help="where the guest's run directory and scratch disk go (default: a "
                    "temporary directory in $TMPDIR); /dev/shm keeps the host's disk out of the figures")
    ap.add_argument("--libvirt", metavar="URI", help="run the probe guest as a transient libvirt domain on URI "
                    "(e.g. qemu:///system; libvirtd started by scripts/services.sh) and capture it through libvirt")
    args = ap.parse_args()
    if args.capture_pin:
        os.sched_setaffinity(0, pin_set(args.capture_pin))
    work = Path(tempfile.mkdtemp(prefix="kvmtune-capture-cost-", dir=args.workdir))
    host = HostRoot("/")
    rows: list[dict[str, Any]] = []
    ratios: dict[str, list[float]] = {"blockstats": [], "trace": []}
    cpu: dict[str, list[Window]] = {"blockstats": [], "trace": []}
    with measure_lock():
        before = loadavg()
        with (libvirt_subject if args.libvirt else probe_subject)(args, work) as subject:
            pinning = (f"QEMU on CPUs {sorted(os.sched_getaffinity(subject.pid))}, capture on CPUs "
                       f"{sorted(os.sched_getaffinity(0))}" + ("" if args.pin or args.capture_pin else " (not pinned)"))
            time.sleep(3)
            for r in range(args.rounds):
                order = ("blockstats", "trace") if r % 2 == 0 else ("trace", "blockstats")
                base = [uncaptured(subject, args.seconds)]
                got: dict[str, Window] = {}
                for source in order:
                    got[source] = captured(host, subject, work, source, args.seconds)
                    base.append(uncaptured(subject, args.seconds))
                for i, source in enumerate(order):
                    w = got[source]
                    beside = (base[i] + base[i + 1]) / 2
                    ratios[source].append(w.iops / beside)
                    cpu[source].append(w)
                    rows.append({"round": r + 1, "source": source, "iops": w.iops,
                                 "uncaptured_beside": [base[i], base[i + 1]], "ratio": w.iops / beside,
                                 "capture_cpu_s": w.cpu_s, "capture_wall_s": w.wall_s, "requests": w.requests})
                    print(f"round {r + 1} {source:10s} {w.iops:8.0f} IOPS against {base[i]:.0f}/{base[i + 1]:.0f} "
                          f"uncaptured: {w.iops / beside:.3f}; capture CPU {w.cpu_s:.2f} s in {w.wall_s:.1f} s"
                          + (f", {w.requests} requests" if w.requests else ""), flush=True)
            rtt = qmp_round_trips(subject, args.qmp_samples) if args.qmp_samples else []
        after = loadavg()
    shutil.rmtree(work, ignore_errors=True)
    guest = f"libvirt domain on {args.libvirt} (QMP through libvirt, events through virtlogd)" if args.libvirt else \
        "probe guest (its own QMP socket, stderr a file)"
    head = (f"{guest}, job {args.job!r}, {args.rounds} rounds of {args.seconds:g} s a window, load average {before} -> {after}, "
            f"nproc {os.cpu_count()}, {pinning}, guest disk in {work}, TCG (emulation figures)")
    print(head)
    summary: dict[str, Any] = {"head": head, "rows": rows}
    if rtt:
        q = statistics.quantiles(rtt, n=100)
        print(f"query-blockstats round trip over {len(rtt)} calls: median {statistics.median(rtt) * 1e6:.0f} µs, "
              f"p99 {q[98] * 1e6:.0f} µs, max {max(rtt) * 1e6:.0f} µs: one a second is at most "
              f"{q[98]:.3%} of the vCPU's time (p99)")
        summary["qmp_round_trip_s"] = rtt
    for source, rs in ratios.items():
        if not rs:
            continue
        centre, interval = log_interval(rs)
        word = at_least(interval, BOUND[source])
        iv = f"[{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "[no interval]"
        print(f"{source:10s} captured/uncaptured IOPS: geometric mean {centre:.3f} {iv}, {spread(rs)}; "
              f"'cost at most {1 - BOUND[source]:.0%}' {word}")
        summary[source] = {"centre": centre, "interval": interval, "verdict": word, "ratios": rs}
    for source, ws in cpu.items():
        if not ws:
            continue
        share = [w.cpu_s / w.wall_s for w in ws]
        line = (f"{source:10s} the capture's own CPU: median {statistics.median(share):.1%} of one host CPU "
                f"(range {min(share):.1%}-{max(share):.1%}, {len(ws)} captures)")
        per = [w.cpu_s / w.requests * 1e6 for w in ws if w.requests]
        if per:
            line += f", {statistics.median(per):.1f} µs per recorded request (range {min(per):.1f}-{max(per):.1f})"
        print(line)
        summary[f"{source}_capture_cpu_share"] = share
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
