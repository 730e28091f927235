"""``kvmtune why``'s disk causes: I/O limits (QMP, libvirt), latency past the disk-latency signal, the backing host
device's diskstats and the queue count against the vCPUs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from kvmtune.audit.finding import Finding
from kvmtune.host.blockdev import block_device_of
from kvmtune.host.parsers import parse_diskstats
from kvmtune.host.root import HostRoot
from kvmtune.live.diagnose import Diagnosis
from kvmtune.live.model import DiskCounters, GuestSample
from kvmtune.live.sources import Sampler
from kvmtune.live.why.core import (
    LIMITS,
    CatalogueRule,
    Target,
    WhyLine,
    WhyReport,
    capture_hint,
    rule_fix,
    verify_text,
)
from kvmtune.model.guest import Disk

# --- disks, network, memory ---------------------------------------------------------------------------


def limits_qmp(sampler: Sampler, pid: int) -> dict[str, dict[str, int]]:
    qmp = sampler.procs.qmp(pid) if sampler.procs is not None else None
    if qmp is None:
        return {}
    try:
        blocks = qmp.execute("query-block")
    except Exception:  # a monitor that stops answering costs this one reading
        return {}
    out: dict[str, dict[str, int]] = {}
    for b in blocks if isinstance(blocks, list) else []:
        inserted = b.get("inserted") or {}
        name = str(b.get("device") or b.get("qdev") or "?").removeprefix("/machine/peripheral/")
        name = name.removesuffix("/virtio-backend")
        limits = {k: int(inserted.get(k) or 0) for k in ("iops", "iops_rd", "iops_wr", "bps", "bps_rd", "bps_wr")}
        out[name] = {k: v for k, v in limits.items() if v > 0}
    return out


def limits_libvirt(sampler: Sampler, target: Target, disks: list[str]) -> dict[str, dict[str, int]]:
    keys = {"total_iops_sec": "iops", "read_iops_sec": "iops_rd", "write_iops_sec": "iops_wr",
            "total_bytes_sec": "bps", "read_bytes_sec": "bps_rd", "write_bytes_sec": "bps_wr"}
    out: dict[str, dict[str, int]] = {}
    for source in sampler.libvirt:
        if source.uri != target.source:
            continue
        try:
            dom = source.conn.lookupByName(target.name)
            for disk in disks:
                tune = dom.blockIoTune(disk, 0)
                out[disk] = {keys[k]: int(v) for k, v in tune.items() if k in keys and int(v) > 0}
        except Exception:  # libvirt's own error type; no limits read
            return out
    return out


def _held_by(limits: dict[str, int], rd: float, wr: float, rd_b: float, wr_b: float) -> str:
    seen = {"iops": rd + wr, "iops_rd": rd, "iops_wr": wr, "bps": rd_b + wr_b, "bps_rd": rd_b, "bps_wr": wr_b}
    for key, limit in limits.items():
        if seen[key] >= LIMITS.throttle_near * limit:
            unit = "ops/s" if key.startswith("iops") else "bytes/s"
            return f"{seen[key]:.0f} {unit} against its limit {key}={limit}"
    return ""


def disk_lines(report: WhyReport, a: GuestSample, b: GuestSample, dt: float, limits: dict[str, dict[str, int]],
                diagnoses: list[Diagnosis], own_use: dict[str, int], interval_ns: int) -> None:
    main = sum(v for k, v in own_use.items() if k.startswith(("qemu-system", "qemu-kvm", "worker"))) / interval_ns
    iothreads = sum(v for k, v in own_use.items() if k.startswith("IO ")) / interval_ns
    for name, db in sorted(b.disks.items()):
        da = a.disks.get(name) or DiskCounters()
        rd, wr = (db.rd_ops - da.rd_ops) / dt, (db.wr_ops - da.wr_ops) / dt
        rd_b, wr_b = (db.rd_bytes - da.rd_bytes) / dt, (db.wr_bytes - da.wr_bytes) / dt
        ops = (db.rd_ops - da.rd_ops) + (db.wr_ops - da.wr_ops)
        busy_ns = (db.rd_ns - da.rd_ns) + (db.wr_ns - da.wr_ns) + (db.fl_ns - da.fl_ns)
        latency = busy_ns / ops / 1e6 if ops else None
        depth = busy_ns / (dt * 1e9)
        held = _held_by(limits.get(name, {}), rd, wr, rd_b, wr_b)
        report.disks.append({"disk": name, "read_iops": rd, "write_iops": wr, "read_bytes_s": rd_b, "write_bytes_s": wr_b,
                             "latency_ms": latency, "queue_depth": depth, "limits": limits.get(name, {}),
                             "throttled": bool(held), "main_loop_cpu": main, "iothreads_cpu": iothreads})
        where = f"I/O done by {'IOThreads' if iothreads > main else 'the main loop'} (main loop {main:.0%}, " \
                f"IOThreads {iothreads:.0%} of a CPU)"
        lat = "–" if latency is None else f"{latency:.1f} ms/op"
        if held:
            report.lines.append(WhyLine(
                "disk", min(1.0, depth) or None, f"disk {name} is throttled: {held}",
                f"{rd + wr:.0f} ops/s, {lat}, queue depth {depth:.1f}; {where}",
                "throttled: an I/O limit (<iotune>, QMP block_set_io_throttle) holds it", None,
                "raise or remove the limit (virsh blkdeviotune DOMAIN DISK …, QMP block_set_io_throttle)",
                verify_text(None, report.target.name, "the disk should run below its limit"),
                no_rule="no rule covers an I/O limit: it is set on purpose"))
            continue
        for d in diagnoses:
            if d.signal == f"disk-latency {name}":
                rule = d.rules[0] if d.rules else None
                report.lines.append(WhyLine(
                    "disk", min(1.0, depth), f"disk {name}: {d.value} ({d.level}, threshold {d.threshold})",
                    f"{rd + wr:.0f} ops/s, queue depth {depth:.1f}; {where}; rules of its configuration: "
                    f"{d.explanation}", "the disk's configuration", rule, d.fix or (rule_fix(rule) if rule else ""),
                    verify_text(rule, report.target.name, "the latency should fall below the threshold")
                    + capture_hint(rule, report.target.name),
                    no_rule="" if rule else "no rule covers this disk's latency: no finding of its configuration "
                    "explains it"))





def backing_device(host: HostRoot, source: str | None) -> str | None:
    """The host block device behind a disk's source (:func:`~kvmtune.host.blockdev.block_device_of`); None for a
    network disk or a file on a file system without one (tmpfs, NFS)."""
    if not source or not source.startswith("/"):
        return None
    return block_device_of(host, source)


def _edges(text: str) -> dict[str, tuple[int, int, int]]:
    """``/proc/diskstats`` (:func:`~kvmtune.host.parsers.parse_diskstats`): device -> (reads + writes completed, ms
    spent on them, ms the device was busy)."""
    return {name: (d.reads + d.writes, d.read_ms + d.write_ms, d.io_ticks_ms) for name, d in parse_diskstats(text).items()}


@dataclass
class DiskEdges:
    """``/proc/diskstats`` at the start and the end of the sampling."""

    t0: float = 0.0
    t1: float = 0.0
    start: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    end: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    def read(self, host: HostRoot, first: bool) -> None:
        stats = _edges(host.read_optional("/proc/diskstats") or "")
        if first:
            self.t0, self.start = time.monotonic(), stats
        else:
            self.t1, self.end = time.monotonic(), stats

    def of(self, dev: str) -> dict[str, Any] | None:
        if dev not in self.start or dev not in self.end:
            return None
        a, b = self.start[dev], self.end[dev]
        ios, ms, busy = b[0] - a[0], b[1] - a[1], b[2] - a[2]
        return {"device": dev, "await_ms": ms / ios if ios > 0 else None,
                "util": min(1.0, busy / max(1e-3, (self.t1 - self.t0) * 1000)), "ios": ios}


# the rules of the disk's queue count against its vCPUs (the iothreads topic), from the catalogue
BLK_QUEUES = CatalogueRule("iothreads", "virtio-blk-queues")
SINGLE_QUEUE_MACHINE = CatalogueRule("iothreads", "machine-type-single-queue")


def _model_disk(g: GuestSample, name: str) -> Disk | None:
    return next((d for d in (g.guest.disks if g.guest else []) if d.target == name or name.endswith(d.target)), None)


def _queue_rule(findings: list[Finding], disk: Disk) -> tuple[str, Finding] | None:
    """The rule of the queue-count family (``BLK_QUEUES``, ``SINGLE_QUEUE_MACHINE``) that judged this disk's queue
    count, with its finding."""
    for f in findings:
        if f.rule == BLK_QUEUES.id and f.target.device == disk.label and "queues=" in f.actual:
            return f.rule, f
        if f.rule == SINGLE_QUEUE_MACHINE.id and disk.target in f.actual.replace(",", " ").split():
            return f.rule, f
    return None


def disk_extras(report: WhyReport, host: HostRoot, g: GuestSample, edges: DiskEdges, findings: list[Finding]) -> None:
    """The backing device's host diskstats, and the queue count against the vCPUs, for each disk sampled."""
    vcpus = len(g.vcpus) or (g.guest.vcpus if g.guest is not None and g.guest.vcpus else 1)
    for entry in report.disks:
        name = entry["disk"]
        model = _model_disk(g, name)
        dev = backing_device(host, model.source if model else None)
        host_io = edges.of(dev) if dev else None
        entry["host_device"] = host_io
        ops = entry["read_iops"] + entry["write_iops"]
        if host_io is not None:
            aw = "–" if host_io["await_ms"] is None else f"{host_io['await_ms']:.1f} ms"
            for line in report.lines:
                if line.area == "disk" and line.what.startswith(f"disk {name}"):
                    line.evidence += f"; host device {dev}: await {aw}, {host_io['util']:.0%} busy"
            if host_io["util"] >= LIMITS.host_busy and ops >= 1:
                report.lines.append(WhyLine(
                    "disk", host_io["util"], f"disk {name}: its backing device {dev} was {host_io['util']:.0%} busy "
                    f"on the host (await {aw})",
                    f"/proc/diskstats {dev}: {host_io['ios']} I/Os, await {aw}, busy {host_io['util']:.0%} of the "
                    f"interval; the guest did {ops:.0f} ops/s", "the host device behind it is saturated", None,
                    f"move the image to a less busy device, or find who else uses {dev} (iotop, /proc/diskstats)",
                    verify_text(None, report.target.name, f"{dev} should be less than {LIMITS.host_busy:.0%} busy"),
                    no_rule="no rule covers a saturated host device: it is shared with whatever else uses it"))
        judged = _queue_rule(findings, model) if model is not None else None
        entry["queues"] = model.queues if model is not None and model.queues else (1 if judged else None)
        if judged is not None and ops >= 1:
            rule, finding = judged
            report.lines.append(WhyLine(
                "disk", None, f"disk {name}: fewer queues than its {vcpus} vCPUs ({finding.actual})",
                f"{ops:.0f} ops/s, queue depth {entry['queue_depth']:.1f}; {finding.evidence}",
                "queue count against vCPUs: the vCPUs' submissions share one queue's lock", rule,
                finding.fix.description or rule_fix(rule),
                verify_text(rule, report.target.name, "the latency at the same load should fall")))
