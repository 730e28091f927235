"""The canary suite's metrics: name, unit, direction. The suite's version changes when a metric's meaning does."""

from __future__ import annotations

from dataclasses import dataclass

SUITE_VERSION = "1"
KIND = "canary"  # the results store's run kind of a canary run
RESET_KIND = "canary-reset"  # a `canary baseline --reset`: a run row without cells, its note the reason
JUDGEMENT_KEY = "canary-judgement"  # the cell that records a run's overall verdict


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    higher_is_better: bool
    tier: str
    what: str
    spread_judges_busy: bool = True  # a tail percentile varies round to round by nature: not a sign of other work
    # what a figure is labelled with and compared only within (a cell's ``labels``; a run of an older kvmtune without
    # them: the run's environment): the KVM module, the accelerator
    compared_within: tuple[str, ...] = ()


METRICS: tuple[Metric, ...] = (
    Metric("block.randread4k.qd32.iops", "IOPS", True, "block",
           "random 4 KiB reads at depth 32 through qemu-storage-daemon (raw, cache=none, aio=native)"),
    Metric("block.randwrite4k.qd1.flush.p50", "us", False, "block",
           "random 4 KiB writes at depth 1, a flush (fdatasync) after each: the flush's median latency"),
    Metric("block.randwrite4k.qd1.flush.p99", "us", False, "block",
           "random 4 KiB writes at depth 1, a flush (fdatasync) after each: the flush's 99th percentile latency", False),
    Metric("datapath.rr.p50", "us", False, "datapath",
           "netload request/response (1 byte each way) through a Linux bridge in kvmtune's own namespaces: median"),
    Metric("datapath.stream", "B/s", True, "datapath",
           "netload stream (30 KiB reads) through the same bridge"),
    Metric("datapath.vhost.rr.p50", "us", False, "datapath",
           "netload request/response from a virtio-net NIC on a tap with vhost-net (the host kernel moving the "
           "guest's packets) through the same bridge: median. Where the host has /dev/vhost-net; marked not measured "
           "where it has not, and in suite 1 also where it has (it needs a KVM probe guest on the tap)"),
    Metric("kvm.create_vm_vcpu", "us", False, "kvm",
           "KVM_CREATE_VM plus one KVM_CREATE_VCPU, closed again: median of 20 (full suite only; compared only "
           "between runs on the same KVM module)", compared_within=("kvm_module",)),
    Metric("probe.boot_to_agent", "s", False, "probe",
           "the probe guest (the host's kernel, kvmtune's initramfs with qemu-ga) from QEMU's start to its agent's "
           "first answer: labelled with the accelerator QEMU ran (and the KVM module under KVM) and compared only "
           "within it, so a TCG figure is never compared with a KVM one (full suite only)",
           compared_within=("accel", "kvm_module")),
)
BY_NAME = {m.name: m for m in METRICS}
