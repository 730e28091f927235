"""Guest-visible disk fixes (bus, SCSI controller, IOThread, queues) measured in two booted probe guests.

Side A is the finding's disk as the audit read it: its bus, its SCSI controller's model and
IOThread, its IOThread and virtio-blk queues, the guest's vCPUs and machine type, and the
replica layout of the block tier (:func:`kvmtune.verify.block.pair.layout_of`: format, cache, AIO).
Side B is not guessed: the rule's own fixer runs on a copy of the guest's definition (what
``kvmtune fix`` would write, guest-visible changes allowed on the copy) and the same disk is read
back. Both are booted once (:class:`kvmtune.lab.probe.pair.ProbePair`) and fio runs inside them,
against the raw scratch disk, alternately, until the verdict settles or the finding's cap.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from kvmtune.audit.verifyplan import FioJob, GuestExperiment
from kvmtune.errors import KvmtuneError
from kvmtune.fix.registry import FixOptions
from kvmtune.host.root import HostRoot
from kvmtune.lab.accel import AccelChoice
from kvmtune.lab.probe.kernel import choice_for, lacks_line
from kvmtune.lab.probe.pair import (
    ProbePair,
    Unbootable,
    kernel_lacks,
    side_device,
    side_hardware,
    side_modules,
)
from kvmtune.lab.probe.side import GuestSide, TwoSides
from kvmtune.lab.replica import Layout, Unreplicable
from kvmtune.lab.storage.fio import parse_fio_json
from kvmtune.lab.vocabulary import NOT_COMPARABLE
from kvmtune.model.guest import Disk, Guest
from kvmtune.verify.block.pair import layout_of, scratch_parent
from kvmtune.verify.experiments import Outcome, Subject, Unmeasurable, VerifyContext, replay_fix
from kvmtune.verify.guest.accel import require_accel
from kvmtune.verify.measure import Metric, alternate, judge, settles

IOPS = Metric("iops", "IOPS", True, "fio inside the probe guest against its raw scratch disk")
# a machine type QEMU itself still provides (its compat properties: e.g. one virtio queue before 5.2)
_UPSTREAM_MACHINE = re.compile(r"^pc(-(i440fx|q35)-\d+\.\d+)?$|^q35$")
_GUEST_DISK = re.compile(r"^(vd[a-z]{1,2}|sd[a-z]{1,2}|hd[a-z]|nvme\d+n\d+)$")
FIO = "/usr/bin/fio"
EXEC_SLACK_S = 90.0  # fio's start in an emulated guest, on top of its runtime


def _host_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except OSError:
        return os.cpu_count() or 1


def _machine(guest: Guest, assumed: list[str]) -> str:
    machine = (guest.machine or "pc").lower()
    if _UPSTREAM_MACHINE.match(machine):
        return machine
    plain = "q35" if "q35" in machine else "pc"
    assumed.append(f"machine type {guest.machine} is not upstream QEMU's: the probe guests run {plain}")
    return plain


def _scsi_model(disk: Disk) -> str:
    model = (disk.scsi_controller_model or "").lower()
    if model in ("", "default", "auto"):
        return "lsilogic"  # libvirt's default on x86
    return "virtio-scsi" if model.startswith("virtio") else model


def side_of(guest: Guest, disk: Disk, layout: Layout, assumed: list[str] | None = None) -> GuestSide:
    """The probe guest's hardware for ``disk`` of ``guest`` (read from the audit's model), on a replica of ``layout``."""
    notes = assumed if assumed is not None else []
    bus = (disk.bus or "").lower()
    virtio_scsi = bus == "scsi" and _scsi_model(disk) == "virtio-scsi"
    vcpus = guest.vcpus or 1
    cap = _host_cpus()
    if vcpus > cap:
        notes.append(f"{vcpus} vCPUs run as {cap} (this host's CPUs)")
        vcpus = cap
    return GuestSide(
        disk_bus=bus or None,
        scsi_model=_scsi_model(disk) if bus == "scsi" else None,
        disk_iothread=bool(disk.iothread) if bus == "virtio" else bool(disk.scsi_controller_iothread) and virtio_scsi,
        disk_queues=disk.queues if bus == "virtio" else None,
        disk_queue_size=disk.queue_size if bus == "virtio" else None,
        disk_format=layout.format,
        disk_cache="writeback" if layout.cache == "default" else layout.cache,
        disk_io=layout.io,
        vcpus=vcpus,
        machine=_machine(guest, notes),
    )


def _disk_for(subject: Subject) -> Disk | None:
    """The finding's disk; for a controller or machine finding, the first data disk it is about."""
    if subject.disk is not None or subject.guest is None:
        return subject.disk
    device = subject.finding.target.device or ""
    disks = [d for d in subject.guest.disks if d.is_data_disk]
    if device.startswith("scsi-controller:"):
        index = device.split(":", 1)[1]
        return next((d for d in disks if (d.bus or "") == "scsi" and (d.scsi_controller or "0") == index), None)
    return next((d for d in disks if (d.bus or "") == "virtio" or
                 ((d.bus or "") == "scsi" and _scsi_model(d) == "virtio-scsi")), None)


def fixed_guest(guest: Guest, rule_id: str, ctx: VerifyContext) -> Guest:
    """The guest after ``rule_id``'s fixer ran on a copy of its definition (guest-visible changes allowed on the copy)."""
    opts = FixOptions(host=ctx.host, allow_bus_change=True, allow_cpu_change=True, named_rules=frozenset({rule_id}))
    return replay_fix(guest, rule_id, ctx, opts)


def _same_disk(guest: Guest, disk: Disk, after: Guest) -> Disk:
    """``disk`` in the fixed guest: at the same place (a bus change renames it, hda → vda)."""
    index = next((i for i, d in enumerate(guest.disks) if d is disk), None)
    if index is not None and index < len(after.disks) and after.disks[index].source == disk.source:
        return after.disks[index]
    for d in after.disks:
        if d.target == disk.target:
            return d
    raise Unmeasurable(f"disk {disk.target} is gone after the fix")


@dataclass
class GuestDiskExperiment(TwoSides):
    subject: Subject
    disk: Disk
    a: GuestSide
    b: GuestSide
    job: FioJob
    scratch: Path
    accel: AccelChoice
    layout: Layout = field(default_factory=Layout)  # both scratch disks: the block tier's replica of the disk
    assumed: list[str] = field(default_factory=list)
    tier: str = "guest"

    @property
    def workload(self) -> str:
        return f"{self.job.describe()} in the probe guest on its raw disk"

    def scratch_parents(self, ctx: VerifyContext) -> list[Path]:
        return [self.scratch]

    def run(self, ctx: VerifyContext) -> Outcome:
        until = ctx.finding_until()  # the boot counts against the finding's cap
        with ProbePair(self.a, self.b, runner=ctx.runner, workdir=ctx.workdir, accel=self.accel.accel,
                       host=HostRoot(), scratch_parent=self.scratch, disk_size=ctx.size, kernel=ctx.guest_kernel,
                       modules_dir=ctx.guest_modules, layouts=(self.layout, self.layout)) as pair:
            probe = FioProbe(pair, self.job, ctx.seconds)
            samples = alternate(probe, ctx.repeat, ctx.deadline, settled=settles(IOPS, ctx.threshold), until=until)
            accel, boot_s = pair.accel, pair.boot_s
        j = judge(samples, IOPS, ctx.threshold)
        details = {
            "side_a": asdict(self.a), "side_b": asdict(self.b), "samples_a": samples.a, "samples_b": samples.b,
            "accel": accel, "boot_s": round(boot_s, 1), "replica_dir": str(self.scratch), "size": ctx.size,
            "workload": self.workload, "replica_layout": self.layout.describe(),
        }
        notes = list(self.assumed)
        if accel == "tcg":
            details.update({"verdict_under_emulation": j.verdict, "ratio": j.ratio,
                            "interval_95": list(j.interval) if j.interval else None})
            j = replace(j, verdict=NOT_COMPARABLE, rounds_to_settle=None)
        action = "nothing changed on the guest (two probe guests on scratch disks, removed); apply with kvmtune fix"
        return Outcome(j, action, notes, details, samples.cut_short)


class FioProbe:
    """fio inside probe guest A or B against its scratch disk (found once per side in /sys/block)."""

    metric = IOPS

    def __init__(self, pair: ProbePair, job: FioJob, seconds: float) -> None:
        self.pair = pair
        self.job = job
        self.seconds = seconds
        self.devices: dict[str, str] = {}

    def device(self, side: str) -> str:
        if side not in self.devices:
            self.devices[side] = guest_disk(self.pair, side)
        return self.devices[side]

    def argv(self, side: str) -> list[str]:
        job = self.job
        argv = [FIO, f"--name={job.name}", f"--filename=/dev/{self.device(side)}", "--ioengine=libaio", "--direct=1",
                f"--rw={job.rw}", f"--bs={job.bs}", f"--iodepth={job.iodepth}",
                f"--runtime={max(1, round(self.seconds * 1000))}ms", "--time_based", "--output-format=json"]
        if job.fsync:
            argv.append(f"--fsync={job.fsync}")
        if job.rwmixread is not None:
            argv.append(f"--rwmixread={job.rwmixread}")
        if job.numjobs > 1:
            argv += [f"--numjobs={job.numjobs}", "--group_reporting"]
        return argv

    def sample(self, side: str) -> float:
        res = self.pair.exec(side, self.argv(side), self.seconds + EXEC_SLACK_S)
        if res.rc is None:
            raise KvmtuneError(f"fio in probe guest {side} did not finish within {self.seconds + EXEC_SLACK_S:.0f}s")
        if res.rc != 0:
            last = (res.stderr.strip().splitlines() or ["no error output"])[-1][:200]
            raise KvmtuneError(f"fio in probe guest {side} exited {res.rc}: {last}")
        try:
            return parse_fio_json(res.stdout)["iops"]
        except (ValueError, KeyError) as exc:
            raise KvmtuneError(f"fio in probe guest {side}: {exc}") from None


def guest_disk(pair: ProbePair, side: str, attempts: int = 50) -> str:
    """The one disk of probe guest ``side`` (its only block device besides RAM disks), named strictly."""
    for _ in range(attempts):
        res = pair.exec(side, ["/bin/ls", "/sys/block"], 30.0)
        names = res.stdout.split()[:64]
        disks = [n for n in names if _GUEST_DISK.match(n)]
        if len(disks) == 1:
            return disks[0]
        if len(disks) > 1:
            raise KvmtuneError(f"probe guest {side} shows {len(disks)} disks, expected its one scratch disk")
        time.sleep(0.2)  # the driver may still be probing
    raise KvmtuneError(f"probe guest {side} shows no disk: its driver did not find the scratch disk")


def plan_guest_disk(subject: Subject, ctx: VerifyContext, plan: GuestExperiment) -> GuestDiskExperiment:
    """The experiment for a ``disk`` or ``controller`` guest-tier finding; :class:`Unmeasurable` says why not."""
    f, guest = subject.finding, subject.guest
    if not isinstance(plan.job, FioJob):
        raise Unmeasurable("a disk experiment runs fio; the rule names another workload")
    if guest is None:
        raise Unmeasurable("the fix edits a guest's definition, and the finding names no guest")
    disk = _disk_for(subject)
    if disk is None:
        raise Unmeasurable("the finding names no data disk of the guest")
    if disk.source_type not in (None, "file", "block", "volume"):
        raise Unmeasurable(f"a {disk.source_type} disk has no local replica (network storage is not replicated)")
    try:
        layout, assumed = layout_of(disk, subject.image)
    except Unreplicable as exc:
        raise Unmeasurable(str(exc)) from None
    if not layout.starts:
        assumed.append(f"io {layout.io} without O_DIRECT does not start under QEMU: both sides use io threads")
        layout = layout.nearest_valid()
    a = side_of(guest, disk, layout, assumed)
    after = fixed_guest(guest, f.rule, ctx)
    b = side_of(after, _same_disk(guest, disk, after), layout, [])
    if a == b:
        raise Unmeasurable("the fix changes nothing the probe guest can be given")
    for name, side in (("A", a), ("B", b)):
        try:
            side_hardware(side, "/dev/null")
            modules = side_modules(side)
        except Unbootable as exc:
            raise Unmeasurable(f"side {name}: {exc}") from None
        try:
            release, lacking = kernel_lacks(HostRoot(), modules, ctx.guest_kernel, ctx.guest_modules)
        except KvmtuneError as exc:
            raise Unmeasurable(f"no probe guest kernel: {exc}") from None
        if lacking:
            choice = choice_for(ctx.guest_kernel, ctx.guest_modules)
            raise Unmeasurable(lacks_line(f"side {name} ({side_device(side)})", lacking, release, choice))
    accel = require_accel(f.rule, ctx)
    source = disk.source if disk.source_type in (None, "file") else None
    parent, note = scratch_parent(source, ctx.workdir)
    if note:
        assumed.append(note)
    return GuestDiskExperiment(subject, disk, a, b, plan.job, parent, accel, layout, assumed)
