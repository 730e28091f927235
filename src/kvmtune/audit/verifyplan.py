"""What ``kvmtune verify`` measures for a rule's fix: plain data a rule declares, verify/ interprets.

A rule whose fix kvmtune carries out (``fix_kind`` other than ``manual``) sets its
``verify`` class attribute to one of these, in its own file:

* :class:`BlockExperiment` — a guest disk (or image) fix measured on scratch
  replicas of the disk, as it is and as fixed (``verify/block/experiment.py``);
* :class:`HostFixExperiment` — a host fix measured through the runtime value the
  host fix plan writes for the finding (``verify/host/experiment.py``);
* :class:`GuestExperiment` — a fix that changes what the guest sees (bus, controller, NIC model,
  vhost, queues, IOThreads, vCPUs, hugepages) measured in two probe guests, as it is and as fixed
  (``lab/probe/pair.py``: the guest tier's probe-guest pair);
* :class:`NoExperiment` — a one-line reason why nothing is measured.

``tests/verify/test_verify_plans.py`` holds every fixable rule to having one. This
module is plain data: rules/ may import it, and only verify/ gives it a meaning.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class FioJob:
    """One fio workload against an NBD export (block tier) or a probe guest's raw disk (guest tier); ``fsync``: flush
    every N writes, as a guest file system does; ``numjobs``: parallel fio jobs (the guest tier spreads them over the
    probe guest's vCPUs: queue fixes pay off only with submissions from several vCPUs)."""

    name: str
    rw: str
    bs: str = "4k"
    iodepth: int = 16
    fsync: int = 0
    rwmixread: int | None = None
    numjobs: int = 1

    def describe(self) -> str:
        text = f"fio {self.rw} {self.bs} QD{self.iodepth}"
        if self.numjobs > 1:
            text += f" x{self.numjobs} jobs"
        if self.rwmixread is not None:
            text += f" {self.rwmixread}% reads"
        if self.fsync:
            text += f", flush every {self.fsync} writes"
        return text


# the jobs the disk rules share
CACHE_JOB = FioJob("cache", "randwrite", "4k", 16, fsync=32)
AIO_JOB = FioJob("aio", "randrw", "4k", 32, rwmixread=70)
PREALLOC_JOB = FioJob("prealloc", "randwrite", "4k", 16, fsync=32)
DISCARD = "discard"  # measure the host space returned after a trim instead of speed


@dataclass(frozen=True)
class BlockExperiment:
    """The disk as it is vs as fixed, on scratch replicas (block tier).

    ``job``: the fio job that shows the fix's effect, or :data:`DISCARD`. Side B is what the rule's
    fixer writes; a fix that is not an XML edit names its layout change instead (``layout``: Layout
    field → value, e.g. ``{"format": "raw"}``) and who makes it (``by``). ``note``: a line added to
    every measured result (a safety fix that is expected to measure slower says so).
    """

    job: FioJob | str
    layout: dict[str, str] = field(default_factory=dict)
    by: str = "kvmtune fix"
    note: str | None = None


@dataclass(frozen=True)
class NetJob:
    """One netload workload from a probe guest to kvmtune's namespace: ``stream`` (throughput) or ``rr``
    (transactions/s), over ``streams`` parallel connections (multiqueue needs more than one)."""

    name: str
    kind: str = "stream"  # stream | rr
    streams: int = 1
    size: int = 0  # request/message bytes; 0: netload's default for the kind

    def describe(self) -> str:
        text = f"netload {self.kind}"
        if self.streams > 1:
            text += f", {self.streams} streams"
        if self.size:
            text += f", {self.size} B messages"
        return text + " from the probe guest to a kvmtune namespace"


# the jobs the guest-tier rules share
BUS_JOB = FioJob("bus", "randwrite", "4k", 16)
IOTHREAD_JOB = FioJob("iothread", "randrw", "4k", 32, rwmixread=70)
QUEUE_JOB = FioJob("queues", "randread", "4k", 32, numjobs=4)
NIC_STREAM_JOB = NetJob("stream", "stream", 1)
NIC_MQ_JOB = NetJob("multiqueue", "stream", 4)


@dataclass(frozen=True)
class GuestExperiment:
    """The guest as it is vs as fixed, booted as two probe guests (the guest tier).

    ``part``: which part of the probe guest the fix changes: ``disk`` (bus, queues, IOThread of the
    finding's disk), ``controller`` (the disk's SCSI controller model or IOThread), ``nic`` (model,
    vhost, queues, ring sizes of the finding's interface), ``cpu`` (vCPU count and topology) or
    ``memory`` (hugepage backing). Side A is built from the audit's model of that part, side B from
    the same part after the rule's own fixer ran on a copy of the definition. ``job``: the workload
    run inside both guests (fio on the disk, netload through the NIC). ``note``: a line added to
    every measured result.
    """

    part: str
    job: FioJob | NetJob
    note: str | None = None


@dataclass(frozen=True)
class HostFixExperiment:
    """The runtime value ``kvmtune fix --host`` writes for the finding, measured in kvmtune's namespaces
    (per-namespace network settings) or, with ``--apply``, on the host through the journal."""


@dataclass(frozen=True)
class NoExperiment:
    """Nothing is measured for this rule's fix; ``reason`` says why, in one line."""

    reason: str


VerifyPlan = BlockExperiment | GuestExperiment | HostFixExperiment | NoExperiment
