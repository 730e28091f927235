"""The canary's measurements: the block tier (qemu-storage-daemon + fio over NBD on a scratch replica) and the datapath
tier (netload through a Linux bridge in kvmtune's own namespaces), several short rounds each.

It is a :class:`kvmtune.lab.runner.Benchmark`: the benchmark runner takes the host's measuring lock, sweeps what killed
runs left, stores the run and its cells (one cell per metric and round, ``metrics={"value": …}``)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvmtune.bench.net.catalog import parse_test
from kvmtune.bench.net.datapath import DatapathContext, DatapathRun
from kvmtune.bench.storage.block import daemon_argv
from kvmtune.bench.storage.blockjobs import nbd_uri
from kvmtune.canary.metrics import BY_NAME, KIND, SUITE_VERSION
from kvmtune.errors import KvmtuneError
from kvmtune.host.root import HostRoot
from kvmtune.lab.net.endpoint import TopologySpec
from kvmtune.lab.runner import Cell, CellSink
from kvmtune.lab.storage.fio import parse_fio_json
from kvmtune.lab.workdir import Scratch
from kvmtune.qemuopts import fio_option
from kvmtune.runner import Runner

IMAGE_MIB = 64
SOCKET_WAIT_S = 10.0
RR_TEST = "rr1c-1x1--1"
STREAM_TEST = "str-readx30k--1"


VHOST_NET = "/dev/vhost-net"
VHOST_METRIC = "datapath.vhost.rr.p50"
KVM_METRIC = "kvm.create_vm_vcpu"


def unmeasured(host: HostRoot, tiers: tuple[str, ...], quick: bool) -> dict[str, str]:
    """The suite's metrics of ``tiers`` (and, without ``quick``, the full suite's) this host cannot give, each with
    why: a run lists them as "not measured: …" rather than leaving them out unsaid."""
    out: dict[str, str] = {}
    if "datapath" in tiers:
        out[VHOST_METRIC] = ("no /dev/vhost-net (modprobe vhost_net)" if not host.exists(VHOST_NET) else
                             "a vhost-net figure needs a KVM probe guest on a vhost tap; not in suite 1 yet")
    if not quick and "kvm" not in tiers:
        out[KVM_METRIC] = "no KVM module loaded (kvm_intel, kvm_amd, kvm_pvm)"
    return out


@dataclass(kw_only=True)
class CanaryPlan:
    rounds: int = 3
    seconds: float = 1.0  # per fio job and per netload test, per round
    tiers: tuple[str, ...] = ("block", "datapath")


@dataclass(kw_only=True)
class CanaryBenchmark:
    runner: Runner
    host: HostRoot
    scratch_dir: Path  # --dir, resolved; the scratch replica goes into scratch-canary-<pid> below it
    workdir: Path
    netload: str | None
    plan_: CanaryPlan
    environment_of: Callable[[], dict[str, Any]]
    kind: str = KIND
    _scratch: Scratch | None = field(default=None, init=False)

    def plan(self) -> str:
        return (f"canary suite {SUITE_VERSION}: {', '.join(self.plan_.tiers)} tiers, {self.plan_.rounds} rounds of "
                f"{self.plan_.seconds:g}s per metric")

    def planned_cells(self) -> int:
        return self.plan_.rounds * len([m for m in BY_NAME.values() if m.tier in self.plan_.tiers
                                        and m.name != VHOST_METRIC])

    def environment(self) -> dict[str, Any]:
        return self.environment_of()

    def describe(self, cell: Cell) -> str:
        m = BY_NAME.get(cell.workload)
        return f"{cell.metrics.get('value', 0):.4g} {m.unit if m else ''}"

    def execute(self, sink: CellSink) -> None:
        if "block" in self.plan_.tiers:
            self._scratch = Scratch(self.scratch_dir / f"scratch-canary-{os.getpid()}", self.runner)
            run_block(self.runner, self._scratch, self.plan_, sink)
        if "kvm" in self.plan_.tiers:
            from kvmtune.canary.kvmcost import create_cost_us, kvm_module

            module = kvm_module(self.host)
            labels = {"kvm_module": module} if module else {}
            for rnd in range(self.plan_.rounds):
                t0 = time.monotonic()
                sink.record(_cell(KVM_METRIC, rnd, create_cost_us(), duration=time.monotonic() - t0,
                                  labels=labels))
        if "probe" in self.plan_.tiers:
            run_probe(self.runner, self.host, self.workdir, self.plan_, sink)
        if "datapath" in self.plan_.tiers:
            if self.netload is None:
                raise KvmtuneError("netload binary not found: build it (make -C netload) or pass --netload PATH")
            run_datapath(self.runner, self.host, self.workdir, self.netload, self.plan_, sink)

    def cleanup(self) -> list[str]:
        if self._scratch is None:
            return []
        problems = self._scratch.cleanup()
        self._scratch.remove_if_empty()
        return problems


def _cell(metric: str, rnd: int, value: float | None, error: str | None = None, duration: float | None = None,
          labels: dict[str, str] | None = None) -> Cell:
    """One round's figure; ``labels``: what it was measured under and is compared only within
    (``Metric.compared_within``: the accelerator, the KVM module)."""
    if value is None or not value > 0:
        return Cell("canary", {"metric": metric}, metric, "error", rep=rnd, error=error or "no figure", duration_s=duration)
    config: dict[str, Any] = {"metric": metric, "unit": BY_NAME[metric].unit}
    if BY_NAME[metric].compared_within:
        config["labels"] = dict(labels or {})
    return Cell("canary", config, metric, "ok", {"value": value}, rep=rnd, duration_s=duration)


def _make_image(path: Path) -> None:
    """The scratch replica: written through (so reads hit allocated blocks), then synced."""
    chunk = os.urandom(1 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        for _ in range(IMAGE_MIB):
            os.write(fd, chunk)
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_percentiles(raw: str) -> dict[str, float]:
    """The flush (``--fsync=1``: an NBD flush after each write) latency percentiles of fio's first job, in µs."""
    try:
        doc = json.loads(raw[raw.index("{"):])
        pct = doc["jobs"][0]["sync"]["lat_ns"]["percentile"]
        return {"p50": float(pct["50.000000"]) / 1000.0, "p99": float(pct["99.000000"]) / 1000.0}
    except (ValueError, KeyError, IndexError, TypeError):
        return {}


def _fio(runner: Runner, sock: Path, args: list[str], seconds: float) -> tuple[dict[str, float], str]:
    argv = ["fio", "--thread", "--name=canary", "--ioengine=nbd", nbd_uri(sock), *args,
            fio_option("runtime", f"{int(seconds * 1000)}ms"), "--time_based", fio_option("size", f"{IMAGE_MIB}m"),
            "--output-format=json"]
    res = runner.run(argv, timeout=seconds + 30)
    if not res.ok:
        raise KvmtuneError(f"fio failed: {res.describe_failure()}")
    try:
        return parse_fio_json(res.stdout, None), res.stdout
    except ValueError as exc:
        raise KvmtuneError(f"fio output unusable: {exc}") from None


def run_block(runner: Runner, scratch: Scratch, plan: CanaryPlan, sink: CellSink) -> None:
    for tool in ("qemu-storage-daemon", "fio"):
        if runner.which(tool) is None:
            raise KvmtuneError(f"{tool} not found: the canary's block tier needs qemu-storage-daemon and fio")
    image = scratch.add_file(scratch.path("replica.raw"))
    _make_image(image)
    sock = scratch.add_file(scratch.path("nbd.sock"))
    log = scratch.add_file(scratch.path("qsd.log"))
    with open(log, "wb") as err:
        proc = runner.popen(daemon_argv(str(image), "raw", "none", "native", sock), stdin=subprocess.DEVNULL,
                            stdout=err, stderr=err, start_new_session=True)
    scratch.add_process(proc)
    deadline = time.monotonic() + SOCKET_WAIT_S
    while not sock.exists():
        if proc.poll() is not None:
            lines = log.read_text(errors="replace").strip().splitlines()
            raise KvmtuneError(f"qemu-storage-daemon refused the replica: {lines[-1] if lines else proc.returncode}")
        if time.monotonic() > deadline:
            raise KvmtuneError(f"qemu-storage-daemon did not open its NBD socket within {SOCKET_WAIT_S:.0f}s")
        time.sleep(0.02)
    for rnd in range(plan.rounds):
        t0 = time.monotonic()
        m, _raw = _fio(runner, sock, ["--rw=randread", "--bs=4k", "--iodepth=32"], plan.seconds)
        sink.record(_cell("block.randread4k.qd32.iops", rnd, m.get("iops_read"), duration=time.monotonic() - t0))
        t0 = time.monotonic()
        # fio's nbd engine refuses --fdatasync (EINVAL); --fsync=1 sends the same NBD flush after each write
        _m, raw = _fio(runner, sock, ["--rw=randwrite", "--bs=4k", "--iodepth=1", "--fsync=1"], plan.seconds)
        took = time.monotonic() - t0
        sync = _sync_percentiles(raw)
        sink.record(_cell("block.randwrite4k.qd1.flush.p50", rnd, sync.get("p50"), duration=took))
        sink.record(_cell("block.randwrite4k.qd1.flush.p99", rnd, sync.get("p99"), duration=took))


def run_probe(runner: Runner, host: HostRoot, workdir: Path, plan: CanaryPlan, sink: CellSink) -> None:
    """The probe guest's boot to its agent, once a round, under the accelerator that works here (TCG where KVM does not
    boot a guest): each figure labelled with what QEMU ran."""
    from kvmtune.canary.kvmcost import kvm_module
    from kvmtune.canary.probe import boot_to_agent, probe_guest

    guest, accel = probe_guest(runner, host, workdir)
    for rnd in range(plan.rounds):
        t0 = time.monotonic()
        boot = boot_to_agent(guest, accel.accel, workdir, runner)
        module = kvm_module(host) if boot.accel == "kvm" else None
        labels = {"accel": boot.accel} | ({"kvm_module": module} if module else {})
        sink.record(_cell("probe.boot_to_agent", rnd, boot.seconds, duration=time.monotonic() - t0, labels=labels))


class _Collect(CellSink):
    pass


def run_datapath(runner: Runner, host: HostRoot, workdir: Path, netload: str, plan: CanaryPlan, sink: CellSink) -> None:
    spec = TopologySpec("bridge", attach="netns")
    spec.validate()
    tests = [parse_test(name) for _ in range(plan.rounds) for name in (RR_TEST, STREAM_TEST)]
    got = _Collect()
    ctx = DatapathContext(runner=runner, host=host, workdir=workdir, specs=[spec], tests=tests, netload=netload,
                          duration_s=plan.seconds)
    DatapathRun(ctx).execute(got)
    rounds = {RR_TEST: 0, STREAM_TEST: 0}
    for cell in got.results:
        rnd = rounds[cell.workload]
        rounds[cell.workload] += 1
        if cell.workload == RR_TEST:
            sink.record(_cell("datapath.rr.p50", rnd, cell.metrics.get("lat_p50_us"), cell.error, cell.duration_s))
        else:
            sink.record(_cell("datapath.stream", rnd, cell.metrics.get("throughput_Bps"), cell.error, cell.duration_s))

