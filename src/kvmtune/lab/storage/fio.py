"""fio workloads: definitions, the probe guest's boot job and the scripts the host runs in it through its
agent, and JSON result parsing.

Each workload is one fio invocation (``--output-format=json``), run by one ``guest-exec``, so a failing
workload is reported alone and the host samples its counters around it.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kvmtune.errors import InputError
from kvmtune.host.parsers import CpuTimes, parse_proc_stat
from kvmtune.lab.guest import guest_agent_job

PERCENTILES = ("50.000000", "90.000000", "99.000000", "99.900000")


@dataclass(frozen=True)
class Workload:
    name: str
    rw: str
    bs: str = "4k"
    iodepth: int = 16
    numjobs: int = 1
    direct: bool = True
    fs: bool = False
    nrfiles: int = 1
    filesize: str | None = None  # "1k:1m" for a range of file sizes
    rwmixread: int | None = None
    engine: str | None = None
    description: str = ""
    # boot-write-shutdown cycle (seed 001): write ``cycle_mib`` then idle ``cycle_idle_s``
    cycle_mib: int = 0
    cycle_idle_s: float = 0.0
    extra: tuple[str, ...] = field(default=())
    # a captured workload's replay (lab/storage/replay.py): fio's options after --name and the engine, instead of
    # the job's rw/bs/iodepth/size/runtime
    replay: tuple[str, ...] = field(default=())

    @property
    def is_cycle(self) -> bool:
        return self.cycle_mib > 0

    def with_name(self, name: str) -> Workload:
        return replace(self, name=name)


BASIC: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("randread-4k", "randread", "4k", 16, description="random 4 KiB reads, queue depth 16, raw device"),
        Workload("randwrite-4k", "randwrite", "4k", 16, description="random 4 KiB writes, queue depth 16, raw device"),
        Workload("seqread-1m", "read", "1m", 4, description="sequential 1 MiB reads, raw device"),
        Workload("seqwrite-1m", "write", "1m", 4, description="sequential 1 MiB writes, raw device"),
        Workload("randrw-8k", "randrw", "8k", 8, rwmixread=70, description="70/30 random read/write 8 KiB"),
        Workload(
            "fs-randwrite-4k",
            "randwrite",
            "4k",
            1,
            fs=True,
            engine="psync",
            description="random 4 KiB writes into a file on ext4, synchronous (like an installer)",
        ),
    )
}

FFSB_OPS = {
    "create": dict(rw="write", nrfiles=4, description="large file creation"),
    "seqread": dict(rw="read", nrfiles=1, description="sequential reads"),
    "randread": dict(rw="randread", nrfiles=1, description="random reads"),
    "randwrite": dict(rw="randwrite", nrfiles=1, description="random writes"),
    "mail": dict(rw="randrw", nrfiles=32, filesize="1k:1m", rwmixread=50, description="mail-server-like small files"),
}
FFSB_THREADS = (1, 8, 16)


def ffsb_workloads(threads: Sequence[int] = FFSB_THREADS) -> list[Workload]:
    """Seed 000's FFSB operations with 8 KiB blocks, per thread count, direct and buffered."""
    out = []
    for op, spec in FFSB_OPS.items():
        for t in threads:
            for direct in (True, False):
                name = f"ffsb-{op}-t{t}-{'direct' if direct else 'buffered'}"
                out.append(
                    Workload(
                        name,
                        str(spec["rw"]),
                        "8k",
                        1,
                        numjobs=t,
                        direct=direct,
                        fs=True,
                        nrfiles=int(spec["nrfiles"]),  # type: ignore[call-overload]
                        filesize=spec.get("filesize"),  # type: ignore[arg-type]
                        rwmixread=spec.get("rwmixread"),  # type: ignore[arg-type]
                        engine="psync",
                        description=f"FFSB {spec['description']}, {t} thread(s), {'direct' if direct else 'buffered'}",
                    )
                )
    return out


def cycle_workload(write_mib: int = 64, idle_s: float = 3.0) -> Workload:
    return Workload(
        f"cycle-{write_mib}m",
        "write",
        "1m",
        1,
        direct=False,
        cycle_mib=write_mib,
        cycle_idle_s=idle_s,
        description=f"boot, write {write_mib} MiB, wait {idle_s:g}s for flushes, shut down (seed 001)",
    )


ALL_NAMED: dict[str, Workload] = {**BASIC, **{w.name: w for w in ffsb_workloads()}}


def lookup(names: Sequence[str]) -> list[Workload]:
    out = []
    for n in names:
        m = re.fullmatch(r"cycle-(\d+)m", n)
        if m:
            out.append(cycle_workload(int(m.group(1))))
            continue
        if n not in ALL_NAMED:
            known = ", ".join(sorted(BASIC))
            raise InputError("--workload", f"unknown workload {n!r} (known: {known}, ffsb-*, cycle-<MiB>m)")
        out.append(ALL_NAMED[n])
    return out


def _mib(n: float) -> str:
    return f"{max(1, int(n))}m"


def fio_args(w: Workload, target: str, runtime_s: float, disk_mib: int, on_fs: bool) -> list[str]:
    """fio arguments for one workload. ``target``: the raw device, or the directory on the filesystem."""
    args = [f"--name={w.name}", f"--rw={w.rw}", f"--bs={w.bs}", f"--iodepth={w.iodepth}"]
    args.append(f"--ioengine={w.engine or ('libaio' if w.direct else 'psync')}")
    args.append(f"--direct={1 if w.direct else 0}")
    # threads, not forked processes, even for one job: forking fio (80 MB of mapped libraries)
    # costs a visible fraction of a second under TCG
    args.append("--thread")
    if w.numjobs > 1:
        args.append(f"--numjobs={w.numjobs}")
    args.append("--group_reporting")
    if w.rwmixread is not None:
        args.append(f"--rwmixread={w.rwmixread}")
    if on_fs:
        # keep every job's files well inside the filesystem
        budget = disk_mib * 0.5 / max(1, w.numjobs)
        args.append(f"--directory={target}")
        args.append(f"--nrfiles={w.nrfiles}")
        if w.filesize:
            lo, hi = w.filesize.split(":")
            hi_mib = min(1.0, budget * 2 / max(1, w.nrfiles))
            hi = f"{max(8, int(hi_mib * 1024))}k" if hi.lower().endswith("m") else hi
            args.append(f"--filesize={lo}:{hi}")
            args.append("--file_service_type=random")
        else:
            args.append(f"--size={_mib(budget)}")
        if w.rw == "write":
            args.append("--create_on_open=1")
    else:
        args.append(f"--filename={target}")
        args.append(f"--size={_mib(disk_mib)}")
    # fio reads a bare "0.2" as 0 seconds: give milliseconds explicitly
    args += [f"--runtime={max(1, round(runtime_s * 1000))}ms", "--time_based", "--clocksource=clock_gettime", *w.extra]
    return args


@dataclass(frozen=True)
class GuestJob:
    dev: str
    modules: Sequence[str]
    workloads: Sequence[Workload]
    runtime_s: float
    disk_mib: int
    sched: str = "default"
    mkfs: str = "mke2fs"


def _modname(path: str) -> str:
    return path.rsplit("/", 1)[-1].split(".ko", 1)[0].replace("-", "_")


def _preamble(job: GuestJob) -> list[str]:
    """Load the bus's modules and wait for the disk."""
    return [
        "u() { cut -d' ' -f1 /proc/uptime; }",
        # skip modules already loaded (a restored guest has them): insmod reads the whole file first
        *(f"[ -d /sys/module/{_modname(m)} ] || insmod /lib/modules/{shlex.quote(m)} 2>/dev/null" for m in job.modules),
        f"DEV=/dev/{job.dev}",
        "i=0; while [ ! -b $DEV ] && [ $i -lt 500 ]; do sleep 0.02; i=$((i+1)); done",
        '[ -b $DEV ] || { echo "KVMTUNE-FATAL disk $DEV did not appear in the guest"; exit 1; }',
    ]


PREWARMED_FIO = 2
READY = "KVMTUNE-READY"  # the boot job's last line before it waits to be driven through the agent


def _wait_to_be_driven() -> list[str]:
    """Start the guest agent, announce READY, and wait: from here on the host drives the guest."""
    return [guest_agent_job().rstrip("\n"), f'echo "{READY} $(u)"', "while true; do sleep 3600; done"]


def boot_job(job: GuestJob) -> str:
    """The job a booted guest runs (delivered through fw_cfg): bring the disk up, then its agent."""
    return "\n".join([*_preamble(job), *_wait_to_be_driven()]) + "\n"


def wait_job(job: GuestJob) -> str:
    """The job a guest runs before it is saved: bring the disk up, start fio processes that wait for their job,
    then its agent. A restored guest is given the same job (fw_cfg's file keeps its size across the restore)."""
    lines = [
        *_preamble(job),
        # fio processes started now, blocked opening their job FIFO, are saved with the
        # guest: after the restore the first workloads skip fio's start-up (loading and
        # relocating its ~80 MB of libraries costs about 0.5 s under TCG)
        "mkdir -p /tmp/kvw",
        f"for n in {' '.join(str(i) for i in range(PREWARMED_FIO))}; do",
        "  mkfifo /tmp/kvw/$n.ini /tmp/kvw/$n.done",
        "  ( fio --eta=never --output-format=json --output=/tmp/kvw/$n.json /tmp/kvw/$n.ini 2>/tmp/kvw/$n.err &",
        "    echo $! > /tmp/kvw/$n.pid; wait $!; echo $? > /tmp/kvw/$n.done ) &",
        "done",
        f"for n in {' '.join(str(i) for i in range(PREWARMED_FIO))}; do",
        "  i=0; while [ $i -lt 500 ]; do",
        "    p=$(cat /tmp/kvw/$n.pid 2>/dev/null)",
        "    [ -n \"$p\" ] && grep -q libaio /proc/$p/maps 2>/dev/null && grep -q '^State:.*S' /proc/$p/status && break",
        "    sleep 0.02; i=$((i+1))",
        "  done",
        "done",
        *_wait_to_be_driven(),
    ]
    return "\n".join(lines) + "\n"


def prepare_script(job: GuestJob) -> str:
    """What the host runs through the agent before the workloads: the modules a restored guest lacks, the
    I/O scheduler, the file system. A failure prints ``KVMTUNE-FATAL`` and exits non-zero."""
    dev = job.dev
    q = shlex.quote
    lines = [
        *_preamble(job),
        f'echo "KVMTUNE-DISK $DEV $(cat /sys/block/{dev}/size) $(cat /sys/block/{dev}/queue/scheduler)"',
    ]
    if job.sched != "default":
        lines.append(
            f"echo {q(job.sched)} > /sys/block/{dev}/queue/scheduler 2>/dev/null || "
            f'{{ echo "KVMTUNE-FATAL guest I/O scheduler {job.sched} not available: '
            f'$(cat /sys/block/{dev}/queue/scheduler)"; exit 1; }}'
        )
    if any(w.fs for w in job.workloads):
        lines += [
            "if [ -x /usr/sbin/mke2fs ]; then /usr/sbin/mke2fs -q -F -t ext4 -E lazy_itable_init=1,lazy_journal_init=1 "
            "$DEV >/tmp/mkfs.err 2>&1; else mke2fs -F $DEV >/tmp/mkfs.err 2>&1; fi || "
            '{ echo "KVMTUNE-FATAL mkfs failed: $(tail -n 1 /tmp/mkfs.err)"; exit 1; }',
            'mount $DEV /mnt 2>/tmp/mount.err || { echo "KVMTUNE-FATAL mount failed: $(cat /tmp/mount.err)"; exit 1; }',
            'echo "KVMTUNE-FS $(df -k /mnt | tail -n 1)"',
        ]
    return "\n".join(lines) + "\n"


def workload_script(job: GuestJob, w: Workload, slot: int) -> str:
    """What the host runs through the agent for workload ``w``: its output carries the guest's CPU counters,
    fio's exit code, error and JSON between ``KVMTUNE-`` markers (:func:`kvmtune.bench.storage.guest.parse_console`
    reads them). ``slot``: the pre-started fio of a restored guest to hand the job to, when there is one."""
    q = shlex.quote
    lines = [
        "u() { cut -d' ' -f1 /proc/uptime; }",
        f"DEV=/dev/{job.dev}",
        # a workload's fio options as a job file (for a fio that is already running)
        'ini() { echo "[$1]"; shift; for a in "$@"; do echo "${a#--}"; done; }',
        f"slot={slot}",
        "run() {",
        "  name=$1; shift",
        '  echo "KVMTUNE-W-BEGIN $name $(u)"',
        '  echo "KVMTUNE-CPU $name a $(head -n 1 /proc/stat)"',
        "  if [ -p /tmp/kvw/$slot.ini ]; then",
        '    ini "$name" "$@" > /tmp/kvw/$slot.ini; read rc < /tmp/kvw/$slot.done',
        "    mv /tmp/kvw/$slot.json /tmp/$name.json; mv /tmp/kvw/$slot.err /tmp/$name.err",
        "    rm -f /tmp/kvw/$slot.ini /tmp/kvw/$slot.done",
        "  else",
        '    fio "$@" --eta=never --output-format=json --output=/tmp/$name.json 2>/tmp/$name.err; rc=$?',
        "  fi",
        '  echo "KVMTUNE-CPU $name b $(head -n 1 /proc/stat)"',
        '  echo "KVMTUNE-W-DONE $name $rc $(u)"',
        "  [ $rc -ne 0 ] && echo \"KVMTUNE-ERR $name $(grep -v '^$' /tmp/$name.err | tail -n 2 | tr '\\n' ' ')\"",
        '  echo "KVMTUNE-JSON-BEGIN $name"; cat /tmp/$name.json 2>/dev/null; echo; echo "KVMTUNE-JSON-END $name"',
        "  rm -f /tmp/$name.json /tmp/$name.err",
        "}",
    ]
    if w.is_cycle:
        lines += [
            f'echo "KVMTUNE-W-BEGIN {w.name} $(u)"',
            f'echo "KVMTUNE-CPU {w.name} a $(head -n 1 /proc/stat)"',
            f"dd if=/dev/zero of=$DEV bs=1M count={w.cycle_mib} conv=fsync 2>/tmp/dd.err; rc=$?",
            f"sleep {w.cycle_idle_s:g}",
            f'echo "KVMTUNE-CPU {w.name} b $(head -n 1 /proc/stat)"',
            f'echo "KVMTUNE-W-DONE {w.name} $rc $(u)"',
            f'[ $rc -ne 0 ] && echo "KVMTUNE-ERR {w.name} $(tail -n 1 /tmp/dd.err)"',
        ]
        return "\n".join(lines) + "\n"
    if w.fs:
        target = f"/mnt/{w.name}"
        lines.append(f"rm -rf /mnt/* 2>/dev/null; mkdir -p {target}")
    else:
        target = "$DEV"
    args = fio_args(w, target, job.runtime_s, job.disk_mib, w.fs)
    lines.append("run " + w.name + " " + " ".join(a if "$DEV" in a else q(a) for a in args))
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- parsing


def _percentiles(clat: dict[str, Any]) -> dict[str, float]:
    pct = clat.get("percentile") or {}
    out = {}
    for key in PERCENTILES:
        if key in pct:
            label = key.rstrip("0").rstrip(".")
            out[f"p{label}"] = float(pct[key]) / 1000.0  # ns → µs
    return out


def parse_fio_json(text: str, job_name: str | None = None) -> dict[str, float]:
    """Metrics from fio's JSON: the first job (the group, with --group_reporting), or the job named ``job_name``
    when one run held several (a stonewalled ramp before the measured job).

    Raises ValueError with a one-line reason when the text is not a usable fio result.
    """
    start = text.find("{")
    if start < 0:
        raise ValueError("fio printed no JSON")
    try:
        data = json.loads(text[start:])
    except json.JSONDecodeError as exc:
        raise ValueError(f"fio JSON is malformed ({exc.msg} at char {exc.pos})") from None
    jobs = data.get("jobs") or []
    if job_name is not None:
        jobs = [j for j in jobs if isinstance(j, dict) and j.get("jobname") == job_name]
    if not jobs:
        raise ValueError("fio JSON has no jobs" + (f" named {job_name}" if job_name is not None else ""))
    job = jobs[0]
    if job.get("error"):
        raise ValueError(f"fio job error {job['error']}")
    m: dict[str, float] = {}
    total_ios = 0.0
    worst: dict[str, float] = {}
    lat_sum = 0.0
    for d in ("read", "write"):
        part = job.get(d) or {}
        ios = float(part.get("total_ios", 0) or 0)
        if not ios and not part.get("io_bytes"):
            continue
        m[f"iops_{d}"] = float(part.get("iops", 0.0))
        m[f"bw_{d}_Bps"] = float(part.get("bw_bytes", 0.0))
        lat = part.get("lat_ns") or part.get("clat_ns") or {}
        if "mean" in lat:
            m[f"lat_mean_{d}_us"] = float(lat["mean"]) / 1000.0
            lat_sum += float(lat["mean"]) / 1000.0 * ios
        for k, v in _percentiles(part.get("clat_ns") or {}).items():
            m[f"clat_{k}_{d}_us"] = v
            worst[k] = max(worst.get(k, 0.0), v)
        total_ios += ios
    if not total_ios and not any(k.startswith("iops_") for k in m):
        raise ValueError("fio did no I/O")
    m["iops"] = m.get("iops_read", 0.0) + m.get("iops_write", 0.0)
    m["bw_Bps"] = m.get("bw_read_Bps", 0.0) + m.get("bw_write_Bps", 0.0)
    if total_ios:
        m["lat_mean_us"] = lat_sum / total_ios
    for k, v in worst.items():
        m[f"clat_{k}_us"] = v
    m["fio_usr_cpu_pct"] = float(job.get("usr_cpu", 0.0))
    m["fio_sys_cpu_pct"] = float(job.get("sys_cpu", 0.0))
    m["fio_runtime_s"] = (
        float(job.get("job_runtime", 0) or 0) / 1000.0
        or float((job.get("read") or {}).get("runtime", 0) or (job.get("write") or {}).get("runtime", 0)) / 1000.0
    )
    return m


def parse_proc_stat_cpu(line: str) -> CpuTimes:
    """The guest's ``cpu  …`` line of /proc/stat, as the job script prints it on the console."""
    if not line.startswith("cpu "):
        raise ValueError(f"not a /proc/stat cpu line: {line[:40]!r}")
    return parse_proc_stat(line)


def cpu_busy_pct(a: CpuTimes, b: CpuTimes) -> float | None:
    """Busy share (everything but idle and iowait) between two /proc/stat cpu samples, in %."""
    total = b.total - a.total
    return 100.0 * (b.busy - a.busy) / total if total > 0 else None
