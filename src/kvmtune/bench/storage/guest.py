"""Run the storage matrix: one probe-guest boot per configuration (a boot-write-
shutdown cycle gets a boot of its own), fio inside, host counters beside it,
every cell stored as it completes.

A cell that cannot run (impossible combination, QEMU refusing an option, fio
failing, a full scratch disk, a kernel that does not boot) is stored with its
one-line error and the matrix goes on.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvmtune.bench.storage.hostio import HostSampler, Snapshot, device_of_path, tps, write_kBps
from kvmtune.bench.storage.matrix import StorageConfig
from kvmtune.bench.storage.snapshot import SnapshotCache
from kvmtune.errors import KvmtuneError
from kvmtune.host.facts import HostFacts
from kvmtune.host.root import HostRoot
from kvmtune.lab.guest import ExtraFile, ProbeGuest, guest_agent_file
from kvmtune.lab.probe.agent import ProbeAgent
from kvmtune.lab.qemu import BUS_GUEST_DEV, BUS_MODULES, Disk, GuestRun, VmSpec
from kvmtune.lab.runner import BenchContext, Cell, CellSink, base_environment
from kvmtune.lab.storage import fio as fiomod
from kvmtune.lab.workdir import Scratch, check_free_space
from kvmtune.qemuopts import Preallocation, fio_option, keyval, member


@dataclass(kw_only=True)
class StorageContext(BenchContext):
    """The storage tiers' state: scratch space, probe guest, and the sizes every cell uses."""

    scratch: Scratch
    guest: ProbeGuest | None = None
    runtime_s: float = 5.0
    disk_mib: int = 1024
    repeat: int = 1
    user_device: str | None = None  # a block device named with --device and --destroy-data
    snapshots: SnapshotCache | None = None  # restore a saved booted guest instead of booting (None: always boot)
    restored_cells: int = 0
    first_result_s: float | None = None


def guest_files() -> tuple[ExtraFile, ...]:
    """What the storage guest tier adds to the probe guest: qemu-ga, to be driven through."""
    return (guest_agent_file(),)


def storage_cell(cfg: StorageConfig, workload: str, status: str = "ok", **fields: Any) -> Cell:
    return Cell(cfg.key, cfg.as_dict(), workload, status, **fields)


# --------------------------------------------------------------------------- images


def create_image(ctx: StorageContext, cfg: StorageConfig, tag: str) -> tuple[str, str]:
    """Create the scratch image (or loop device) for ``cfg``; return (path for QEMU, format)."""
    if cfg.target == "device":
        if not ctx.user_device:
            raise KvmtuneError("target=device needs --device PATH and --destroy-data")
        return ctx.user_device, "raw"
    need = ctx.disk_mib << 20 if cfg.prealloc in ("full", "falloc") or cfg.target == "block" else 64 << 20
    check_free_space(ctx.scratch.root, need + (64 << 20), f"a {ctx.disk_mib} MiB {cfg.fmt} image")
    path = ctx.scratch.path(f"disk-{tag}.{cfg.fmt}")
    ctx.scratch.add_file(path)
    if cfg.target == "block":
        res = ctx.runner.run(["fallocate", "-l", f"{ctx.disk_mib}M", str(path)], timeout=120)
        if not res.ok:
            raise KvmtuneError(f"{path}: cannot allocate the loop device's backing file ({res.describe_failure()})")
        res = ctx.runner.run(["losetup", "--find", "--show", "--direct-io=on", str(path)], timeout=30)
        if not res.ok:
            raise KvmtuneError(f"loop device for {path}: {res.describe_failure()}")
        dev = res.stdout.strip()
        if not re.fullmatch(r"/dev/loop\d+", dev):
            raise KvmtuneError(f"losetup returned {dev!r}, not a loop device")
        ctx.scratch.add_loop(dev)
        return dev, "raw"
    argv = ["qemu-img", "create", "-q", "-f", cfg.fmt]
    if cfg.prealloc != "off":
        argv += ["-o", keyval(("preallocation", member("preallocation", Preallocation, cfg.prealloc)))]
    argv += [str(path), f"{ctx.disk_mib}M"]
    res = ctx.runner.run(argv, timeout=300)
    if not res.ok:
        raise KvmtuneError(f"{path.name}: qemu-img create failed: {res.describe_failure()}")
    return str(path), cfg.fmt


def check_user_device(host: HostRoot, path: str) -> str:
    """Refuse a block device that is mounted, swapped on, held by another device or busy; return its name."""
    import stat as _stat

    try:
        st = os.stat(path)
    except OSError as exc:
        raise KvmtuneError(f"{path}: {exc.strerror}") from None
    if not _stat.S_ISBLK(st.st_mode):
        raise KvmtuneError(f"{path}: not a block device")
    name = device_of_path(host, path) or Path(path).name
    names = {name, *(p for p in host.listdir(f"/sys/class/block/{name}") if p.startswith(name))}
    facts = HostFacts(host)
    listed = [(m.device, "/proc/mounts") for m in facts.mounts] + [(s.filename, "/proc/swaps") for s in facts.swaps or []]
    for dev, where in listed:
        if dev.startswith("/dev/") and dev[5:] in names:
            raise KvmtuneError(f"{path}: in use ({dev} is listed in {where}); refusing to write to it")
    for n in names:
        if host.listdir(f"/sys/class/block/{n}/holders"):
            raise KvmtuneError(f"{path}: in use (held by {', '.join(host.listdir(f'/sys/class/block/{n}/holders'))})")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_EXCL)
        os.close(fd)
    except OSError as exc:
        raise KvmtuneError(f"{path}: busy ({exc.strerror}); refusing to write to it") from None
    return name


# --------------------------------------------------------------------------- guest runs


@dataclass
class _Marks:
    begin: dict[str, Snapshot] = field(default_factory=dict)
    done: dict[str, Snapshot] = field(default_factory=dict)
    first_json_at: float | None = None


def parse_console(lines: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per workload: rc, json text, cpu samples a/b, error; plus '' for guest-wide fatal errors."""
    out: dict[str, dict[str, Any]] = {}
    collecting: str | None = None
    buf: list[str] = []
    for line in lines:
        if collecting is not None:
            if line.startswith(f"KVMTUNE-JSON-END {collecting}"):
                out.setdefault(collecting, {})["json"] = "\n".join(buf)
                collecting, buf = None, []
            else:
                buf.append(line)
            continue
        parts = line.split(" ", 3)
        tag = parts[0]
        if tag == "KVMTUNE-JSON-BEGIN" and len(parts) > 1:
            collecting, buf = parts[1], []
        elif tag == "KVMTUNE-W-DONE" and len(parts) > 2:
            out.setdefault(parts[1], {})["rc"] = int(parts[2]) if parts[2].lstrip("-").isdigit() else -1
        elif tag == "KVMTUNE-CPU" and len(parts) > 3:
            out.setdefault(parts[1], {})[f"cpu_{parts[2]}"] = parts[3]
        elif tag == "KVMTUNE-ERR" and len(parts) > 1:
            out.setdefault(parts[1], {})["error"] = line.split(" ", 2)[2].strip() if len(parts) > 2 else "failed"
        elif tag == "KVMTUNE-FATAL":
            out.setdefault("", {})["error"] = line.split(" ", 1)[1].strip() if len(parts) > 1 else "guest job failed"
        elif tag == "KVMTUNE-WARN":
            out.setdefault("", {}).setdefault("warnings", []).append(line)
    return out


def _boot_group(
    ctx: StorageContext, cfg: StorageConfig, workloads: Sequence[fiomod.Workload], image: str, fmt: str, host_dev: str | None
) -> list[Cell]:
    assert ctx.guest is not None
    modules = _modules_for(ctx.guest, cfg.bus, any(w.fs for w in workloads), cfg.sched)
    gjob = fiomod.GuestJob(BUS_GUEST_DEV[cfg.bus], modules, workloads, ctx.runtime_s, ctx.disk_mib, cfg.sched)
    rundir = ctx.scratch.root / "run"
    spec = VmSpec(
        guest=ctx.guest, accel=ctx.accel.accel, memory_mb=ctx.memory_mb, smp=ctx.smp,
        disks=[Disk(image, fmt, cfg.bus, cfg.cache, cfg.aio)], job=fiomod.boot_job(gjob),
        agent_socket=rundir / f"qga-{os.getpid()}.sock",
    )
    boot_job = spec.job
    # a cycle's figure is per VM lifetime, boot included: it always boots
    if ctx.snapshots is not None and cfg.target != "device" and not any(w.is_cycle for w in workloads):
        boot_mods = _modules_for(ctx.guest, cfg.bus, False, "default")
        state = ctx.snapshots.ensure(ctx.guest, ctx.accel.accel, ctx.memory_mb, ctx.smp, cfg.bus, ctx.disk_mib,
                                     cfg.cache, boot_mods, ctx.boot_timeout_s)
        if state is not None:
            spec.incoming, spec.job = state, ctx.snapshots.job(cfg.bus, ctx.disk_mib, boot_mods)
            ctx.restored_cells += len(workloads)
    marks = _Marks()
    started = time.monotonic()
    try:
        outcome, sampler = _run_vm(ctx, spec, gjob, host_dev, marks, started)
    except KvmtuneError:
        if spec.incoming is None:
            raise
        # the saved guest would not load (QEMU changed under us?): boot instead, and stop restoring
        if ctx.snapshots is not None:
            ctx.snapshots.failures[str(spec.incoming)] = "restore failed"
            spec.incoming.unlink(missing_ok=True)
        ctx.restored_cells -= len(workloads)
        spec.incoming, spec.job, marks = None, boot_job, _Marks()
        started = time.monotonic()
        outcome, sampler = _run_vm(ctx, spec, gjob, host_dev, marks, started)
    if marks.first_json_at is not None and ctx.first_result_s is None:
        ctx.first_result_s = marks.first_json_at
    parsed = parse_console(outcome.lines)
    vm_error = outcome.error
    fatal = parsed.get("", {}).get("error")
    life = sampler.series[0], sampler.series[-1]
    results: list[Cell] = []
    for w in workloads:
        info = parsed.get(w.name, {})
        res = storage_cell(cfg, w.name, "ok", duration_s=outcome.duration_s)
        if "rc" not in info:
            res.status = "error"
            res.error = fatal or vm_error or "guest never ran this workload"
            results.append(res)
            continue
        if info["rc"] != 0:
            res.status = "error"
            tool = "dd" if w.is_cycle else "fio"
            res.error = f"{tool} failed in the guest (exit {info['rc']}): {info.get('error', '')}".strip()
            results.append(res)
            continue
        m: dict[str, float] = {}
        if not w.is_cycle:
            try:
                m.update(fiomod.parse_fio_json(info.get("json", "")))
            except ValueError as exc:
                res.status, res.error = "error", f"fio output unusable: {exc}"
                results.append(res)
                continue
            res.raw = info.get("json")
        try:
            busy = fiomod.cpu_busy_pct(
                fiomod.parse_proc_stat_cpu(info.get("cpu_a", "")), fiomod.parse_proc_stat_cpu(info.get("cpu_b", ""))
            )
            if busy is not None:
                m["guest_cpu_busy_pct"] = busy
        except ValueError:
            pass
        a, b = marks.begin.get(w.name), marks.done.get(w.name)
        if a is not None and b is not None:
            t = tps(a, b)
            if t is not None:
                m["host_tps"] = t
                kbps = write_kBps(a, b)
                if kbps is not None:
                    m["host_write_kBps"] = kbps
            if a.cpu_s is not None and b.cpu_s is not None and b.t > a.t:
                m["qemu_cpu_s"] = b.cpu_s - a.cpu_s
                m["qemu_cpu_pct"] = 100.0 * (b.cpu_s - a.cpu_s) / (b.t - a.t)
            m["window_s"] = b.t - a.t
        if w.is_cycle:
            # seed 001: transactions/s on the host disk over the whole VM life (boot to exit)
            lt = tps(life[0], life[1])
            if lt is not None:
                m["host_tps_per_vm"] = lt
            m["vm_lifetime_s"] = life[1].t - life[0].t
            m["write_mib"] = float(w.cycle_mib)
            res.samples = [(s.t - life[0].t, "host_ios", float(s.disk.ios)) for s in sampler.series if s.disk is not None]
        m["guest_restored"] = 1.0 if spec.incoming is not None else 0.0
        res.metrics = m
        results.append(res)
    return results


@dataclass
class _Outcome:
    """What one guest run left: the output of the scripts run in it, in order, and why it stopped early."""

    lines: list[str] = field(default_factory=list)
    error: str | None = None
    duration_s: float = 0.0


def _not_ready(vm: GuestRun, boot_timeout: float, exc: KvmtuneError) -> str:
    """One line: why the guest's agent never answered, from its console."""
    if str(exc).startswith("QEMU stopped the guest"):
        return str(exc)
    try:
        lines = vm.serial.read_bytes()[-64000:].decode("utf-8", "replace").splitlines()
    except OSError:
        lines = []
    fatal = next((ln for ln in lines if ln.startswith("KVMTUNE-FATAL")), None)
    if fatal is not None:
        return fatal.removeprefix("KVMTUNE-FATAL").strip()[:300]
    if not any(ln.startswith("KVMTUNE-BOOTED") for ln in lines):
        panic = next((ln for ln in lines if "Kernel panic" in ln), None)
        if panic is not None:
            return f"kernel did not boot: {panic.strip()[:140]}"
        last = next((ln for ln in reversed(lines) if ln.strip()), "no console output")
        return f"kernel did not boot within {boot_timeout:.0f}s (last console line: {last[:120]!r})"
    return str(exc)


def _run_vm(
    ctx: StorageContext, spec: VmSpec, gjob: fiomod.GuestJob, host_dev: str | None, marks: _Marks, started: float
) -> tuple[_Outcome, HostSampler]:
    """Start (or restore) the guest and drive it through its agent: prepare the disk, then one ``guest-exec`` per
    workload, host counters snapshotted around each; a cycle ends with the guest powering itself off."""
    assert spec.agent_socket is not None
    out = _Outcome()
    try:
        with GuestRun(spec, ctx.scratch.root / "run", ctx.runner) as vm:
            proc = vm.start()
            sampler = HostSampler(ctx.host, host_dev, proc.pid, interval=0.5)
            sampler.start()
            agent = ProbeAgent(vm, spec.agent_socket, "storage")
            try:
                try:
                    agent.connect(time.monotonic() + ctx.boot_timeout_s, ctx.boot_timeout_s, watch_stopped=True)
                except KvmtuneError as exc:
                    if spec.incoming is not None:
                        raise
                    out.error = _not_ready(vm, ctx.boot_timeout_s, exc)
                    return out, sampler
                try:
                    _drive(ctx, agent, gjob, sampler, marks, started, out)
                except KvmtuneError as exc:  # QEMU died or the agent stopped answering: the cells so far stay
                    out.error = str(exc)
                if any(w.is_cycle for w in gjob.workloads) and out.error is None:
                    # the VM's life ends as it would: the guest flushes and powers off
                    with contextlib.suppress(KvmtuneError):  # the guest may be gone before the agent answers
                        agent.spawn(["/bin/sh", "-c", "sync; poweroff -f"])
                    agent.close()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=60)
            finally:
                agent.close()
                sampler.stop()
                out.duration_s = time.monotonic() - started
    finally:
        spec.agent_socket.unlink(missing_ok=True)
    return out, sampler


def _drive(ctx: StorageContext, agent: ProbeAgent, gjob: fiomod.GuestJob, sampler: HostSampler, marks: _Marks,
           started: float, out: _Outcome) -> None:
    """Prepare the disk, then run each workload through the agent, host counters snapshotted around it."""
    prep = agent.exec(["/bin/sh", "-c", fiomod.prepare_script(gjob)], 300.0)
    out.lines += prep.stdout.splitlines()
    if prep.rc != 0:
        out.error = "preparing the guest's disk failed" if prep.rc is not None else "preparing the guest's disk hung"
        return
    slot = 0
    for w in gjob.workloads:
        budget = (w.cycle_idle_s + 10 + w.cycle_mib / 5) if w.is_cycle else (ctx.runtime_s * 3 + 20)
        marks.begin[w.name] = sampler.snap()
        res = agent.exec(["/bin/sh", "-c", fiomod.workload_script(gjob, w, slot)], budget)
        marks.done[w.name] = sampler.snap()
        slot += not w.is_cycle
        out.lines += res.stdout.splitlines()
        if res.rc is None:
            out.error = f"{w.name} did not finish within {budget:.0f}s"
            return
        if marks.first_json_at is None and not w.is_cycle:
            marks.first_json_at = time.monotonic() - started


def _modules_for(guest: ProbeGuest, bus: str, fs: bool, sched: str) -> list[str]:
    wanted = list(BUS_MODULES[bus])
    if sched in ("bfq", "kyber"):
        wanted.append("bfq" if sched == "bfq" else "kyber_iosched")
    return guest.modules_for(wanted)


# --------------------------------------------------------------------------- host (bare metal)


def _host_fio(ctx: StorageContext, cfg: StorageConfig, workloads: Sequence[fiomod.Workload], tag: str) -> list[Cell]:
    check_free_space(ctx.scratch.root, (ctx.disk_mib + 64) << 20, f"a {ctx.disk_mib} MiB bare-metal test file")
    path = ctx.scratch.path(f"host-{tag}.dat")
    ctx.scratch.add_file(path)
    res = ctx.runner.run(["fallocate", "-l", f"{ctx.disk_mib}M", str(path)], timeout=120)
    if not res.ok:
        raise KvmtuneError(f"{path}: cannot allocate ({res.describe_failure()})")
    dev = device_of_path(ctx.host, str(path))
    sampler = HostSampler(ctx.host, dev, None)
    out = []
    for w in workloads:
        if w.is_cycle or w.fs:
            out.append(storage_cell(cfg, w.name, "error", error="workload needs a guest (not run on bare metal)"))
            continue
        args = fiomod.fio_args(w, str(path), ctx.runtime_s, ctx.disk_mib, False)
        a = sampler.snap()
        r = ctx.runner.run(["fio", *args, "--output-format=json"], timeout=ctx.runtime_s * 3 + 60)
        b = sampler.snap()
        cell = storage_cell(cfg, w.name, "ok", duration_s=r.duration_s)
        if not r.ok:
            cell.status, cell.error = "error", f"fio on the host failed: {r.describe_failure()}"
        else:
            try:
                cell.metrics = fiomod.parse_fio_json(r.stdout)
                cell.raw = r.stdout
                t = tps(a, b)
                if t is not None:
                    cell.metrics["host_tps"] = t
            except ValueError as exc:
                cell.status, cell.error = "error", f"fio output unusable: {exc}"
        out.append(cell)
    return out


def host_disk_capacity(ctx: StorageContext, seconds: float = 3.0) -> dict[str, float]:
    """Transactions/s the work directory's disk sustains (4 KiB random writes, O_DIRECT, QD 1):
    the denominator of seed 001's 'VMs per disk'."""
    path = ctx.scratch.path("capacity.dat")
    ctx.scratch.add_file(path)
    check_free_space(ctx.scratch.root, 320 << 20, "the disk capacity probe")
    dev = device_of_path(ctx.host, str(ctx.scratch.root))
    sampler = HostSampler(ctx.host, dev, None)
    a = sampler.snap()
    r = ctx.runner.run(
        [
            "fio",
            "--name=capacity",
            fio_option("filename", Path(path)),
            "--rw=randwrite",
            "--bs=4k",
            "--direct=1",
            "--iodepth=1",
            "--ioengine=psync",
            "--size=256m",
            fio_option("runtime", f"{float(seconds):g}"),
            "--time_based",
            "--fdatasync=1",
            "--output-format=json",
        ],
        timeout=seconds * 4 + 60,
    )
    b = sampler.snap()
    out: dict[str, float] = {}
    if r.ok:
        try:
            out.update({f"capacity_{k}": v for k, v in fiomod.parse_fio_json(r.stdout).items() if k in ("iops",)})
        except ValueError:
            pass
    t = tps(a, b)
    if t is not None:
        out["capacity_host_tps"] = t
    try:
        path.unlink()
    except OSError:
        pass
    return out


# --------------------------------------------------------------------------- driver


def run_matrix(ctx: StorageContext, configs: Sequence[StorageConfig], workloads: Sequence[fiomod.Workload]) -> int:
    """Run every configuration; return the number of failed cells. Raises KeyboardInterrupt through."""
    failed = 0
    n = 0
    for rep in range(ctx.repeat):
        for cfg in configs:
            n += 1
            tag = f"{os.getpid()}-{n}"
            cells: list[Cell]
            problem = cfg.problem()
            if problem is None and cfg.target != "host" and ctx.guest is None:
                problem = "no probe guest"
            if problem is not None:
                cells = [storage_cell(cfg, w.name, "error", error=problem) for w in workloads]
            else:
                cells = []
                try:
                    if cfg.target == "host":
                        cells = _host_fio(ctx, cfg, workloads, tag)
                    else:
                        image, fmt = create_image(ctx, cfg, tag)
                        host_dev = image.rsplit("/", 1)[1] if cfg.target == "block" else device_of_path(ctx.host, image)
                        plain = [w for w in workloads if not w.is_cycle]
                        groups = ([plain] if plain else []) + [[w] for w in workloads if w.is_cycle]
                        for gi, group in enumerate(groups):
                            if gi > 0 and cfg.target != "block":
                                # a fresh image per boot so every cycle starts from the same state
                                image, fmt = create_image(ctx, cfg, f"{tag}-{gi}")
                            cells.extend(_boot_group(ctx, cfg, group, image, fmt, host_dev))
                except KvmtuneError as exc:
                    done = {c.workload for c in cells}
                    cells.extend(storage_cell(cfg, w.name, "error", error=str(exc)) for w in workloads if w.name not in done)
                finally:
                    ctx.scratch.cleanup()
            for c in cells:
                failed += not c.ok
                c.rep = rep
                ctx.record(c)
    return failed


def describe(cell: Cell) -> str:
    """A storage cell's figure on its progress line."""
    m = cell.metrics
    if "host_tps_per_vm" in m:
        return f"{m['host_tps_per_vm']:.1f} host tps/VM"
    return f"{m.get('iops', 0):,.0f} IOPS {m.get('bw_Bps', 0) / 1e6:.1f} MB/s"


def storage_environment(ctx: StorageContext) -> dict[str, Any]:
    """The run's environment: the common record plus fio and the work directory's disk."""
    from kvmtune.bench.storage.hostio import scheduler_of

    env = base_environment(ctx.runner, ctx.host, ctx.accel, ctx.guest)
    fio_v = ctx.runner.run(["fio", "--version"], timeout=20)
    dev = device_of_path(ctx.host, str(ctx.scratch.root))
    env.update({"fio": fio_v.stdout.strip() if fio_v.ok else None, "workdir_device": dev,
                "host_io_scheduler": scheduler_of(ctx.host, dev)})
    return env


@dataclass
class MatrixBenchmark:
    """``kvmtune bench storage``: the probe-guest matrix (configs × workloads × repeat)."""

    ctx: StorageContext
    configs: Sequence[StorageConfig]
    workloads: Sequence[fiomod.Workload]
    kind: str = "storage"

    def planned_cells(self) -> int:
        return len(self.configs) * len(self.workloads) * self.ctx.repeat

    def plan(self) -> str:
        return f"{self.planned_cells()} cells, accelerator {self.ctx.accel.accel}"

    def environment(self) -> dict[str, Any]:
        return storage_environment(self.ctx)

    def describe(self, cell: Cell) -> str:
        return describe(cell)

    def execute(self, sink: CellSink) -> None:
        self.ctx.sink = sink
        run_matrix(self.ctx, self.configs, self.workloads)
        if any(w.is_cycle for w in self.workloads):
            cap = host_disk_capacity(self.ctx, seconds=min(5.0, self.ctx.runtime_s))
            self.ctx.scratch.cleanup()
            if cap:
                host = StorageConfig(target="host")
                sink.record(Cell("host/capacity", host.as_dict(), "disk-capacity", metrics=cap), show=False)

    def space_needed(self) -> tuple[Path, int, str] | None:
        """The least any cell writes: its disk image (or bare-metal test file) plus a margin."""
        if all(c.target == "device" for c in self.configs):
            return None
        return self.ctx.scratch.root, (self.ctx.disk_mib + 64) << 20, f"a {self.ctx.disk_mib} MiB test disk"

    def cleanup(self) -> list[str]:
        problems = self.ctx.scratch.cleanup()
        shutil.rmtree(self.ctx.scratch.root, ignore_errors=True)
        return problems
