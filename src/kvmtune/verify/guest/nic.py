"""Guest NIC findings: the interface as it is vs as the fix makes it, in two probe guests (the guest tier).

Side A is the probe guest with the finding's interface as the audit read it (NIC model, vhost-net,
queue pairs, ring sizes); side B has the same interface after the rule's own fixer ran on a copy of
the definition (exactly what ``kvmtune fix`` would write), read back into the model. Each probe guest
has that NIC on a tap in kvmtune's own namespace (:mod:`kvmtune.lab.probe.net`); netload runs in
the guest (through the guest agent) against a netload server in the namespace, A and B alternating.
The real guest's NICs are never touched.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kvmtune.audit.verifyplan import GuestExperiment, NetJob
from kvmtune.errors import KvmtuneError
from kvmtune.fix.registry import FixOptions
from kvmtune.host.root import HostRoot
from kvmtune.lab.guest import ExtraFile
from kvmtune.lab.leftovers import sweep
from kvmtune.lab.net.netload import find_netload, netload_metrics
from kvmtune.lab.net.netns import NetError
from kvmtune.lab.probe.kernel import KernelChoice, choice_for, lacks_line
from kvmtune.lab.probe.net import VHOST_DEVICE, VHOST_MISSING, GuestNet
from kvmtune.lab.probe.pair import NIC_DEV, NIC_DEVICE, ProbePair, kernel_lacks, nic_modules
from kvmtune.lab.probe.side import GuestPair, GuestSide, TwoSides
from kvmtune.lab.vocabulary import NOT_COMPARABLE
from kvmtune.model.guest import Guest, Nic
from kvmtune.model.values import libvirt_default_nic_model
from kvmtune.verify.experiments import Outcome, Subject, Unmeasurable, VerifyContext, replay_fix
from kvmtune.verify.guest.accel import require_accel
from kvmtune.verify.measure import Metric, alternate, judge, settles

GUEST_NETLOAD = "/usr/bin/netload"
THROUGHPUT = Metric("throughput", "MB/s", True, "netload stream from a probe guest to a kvmtune namespace")
TPS = Metric("transactions", "tx/s", True, "netload request/response from a probe guest to a kvmtune namespace")
EXEC_SLACK_S = 90.0  # connecting and reporting on top of the measuring time, under TCG
MAX_STDERR_LINE = 200
TAP_BACKED = ("bridge", "network", "ethernet")  # libvirt interface types whose QEMU back end is a tap, as the probe's


# --------------------------------------------------------------------------- the sides


def nic_model(nic: Nic, guest: Guest) -> str:
    """The probe guest's NIC model for ``nic`` (libvirt's default when the definition names none)."""
    model = (nic.model or libvirt_default_nic_model(guest.arch, guest.machine) or "").lower()
    if not model:
        raise Unmeasurable("the interface names no model and libvirt's default for this guest is not known")
    if model.startswith("virtio"):
        return "virtio"
    if model.startswith("e1000-"):  # e1000-82540em and its siblings: the e1000 driver
        return "e1000"
    if model not in NIC_DEVICE:
        raise Unmeasurable(f"the probe guest has no {model} NIC (it has {', '.join(NIC_DEVICE)})")
    return model


def wants_vhost(nic: Nic, model: str) -> bool:
    """vhost-net for this interface as libvirt would give it: virtio, not switched off (``driver name='qemu'``,
    ``vhost=off``), on a host that has ``/dev/vhost-net`` (the caller's part)."""
    return model == "virtio" and (nic.driver_name or "").lower() != "qemu" and nic.vhost is not False


@dataclass(frozen=True)
class NicKnobs:
    model: str
    vhost: bool  # as the definition asks (before this host's /dev/vhost-net is considered)
    queues: int | None
    rx_queue_size: int | None
    tx_queue_size: int | None


def knobs_of(nic: Nic, guest: Guest) -> NicKnobs:
    model = nic_model(nic, guest)
    virtio = model == "virtio"
    queues = nic.queues if virtio and nic.queues and nic.queues > 1 else None
    return NicKnobs(model, wants_vhost(nic, model), queues, nic.rx_queue_size if virtio else None,
                    nic.tx_queue_size if virtio else None)


def build_sides(a: NicKnobs, b: NicKnobs, *, vhost_device: bool, cpus: int, guest_vcpus: int,
                job: NetJob) -> tuple[GuestSide, GuestSide, list[str]]:
    """The two probe guests' hardware, and what had to be scaled to this host (one line each).

    Both get the same vCPUs: as many as the larger queue count (or, for a several-stream job, the guest's own
    vCPUs), at most this host's CPUs; a queue count beyond that is measured at it.
    """
    notes: list[str] = []
    want = max(a.queues or 1, b.queues or 1, guest_vcpus if job.streams > 1 else 1)
    vcpus = max(1, min(want, cpus))
    if want > vcpus:
        notes.append(f"{want} vCPUs/queues measured as {vcpus}: the probe guests get at most this host's {cpus} CPUs")

    def side(k: NicKnobs) -> GuestSide:
        queues = min(k.queues, vcpus) if k.queues else None
        return GuestSide(nic_model=k.model, vhost=k.vhost and vhost_device, nic_queues=queues if queues and queues > 1 else None,
                         rx_queue_size=k.rx_queue_size, tx_queue_size=k.tx_queue_size, vcpus=vcpus)

    side_a, side_b = side(a), side(b)
    if not vhost_device and (a.vhost or b.vhost):
        if side_a == side_b:
            raise Unmeasurable(VHOST_MISSING)
        notes.append(f"{VHOST_DEVICE} is missing on this host: virtio-net runs without vhost-net on both sides, as "
                     "libvirt would start it here (modprobe vhost_net)")
    if side_a == side_b:
        raise Unmeasurable("the fix changes nothing the probe guest's NIC can show")
    return side_a, side_b, notes


def _fixed_guest(guest: Guest, rule_id: str, ctx: VerifyContext) -> Guest:
    """The guest after ``rule_id``'s fixer ran on a copy of its definition."""
    # the copy gets what 'kvmtune fix --allow-bus-change' would write: a NIC model change is guest-visible by design
    return replay_fix(guest, rule_id, ctx, FixOptions(host=ctx.host, allow_bus_change=True, named_rules=frozenset({rule_id})))


def fixed_nic(guest: Guest, nic: Nic, rule_id: str, ctx: VerifyContext) -> tuple[Guest, Nic]:
    after = _fixed_guest(guest, rule_id, ctx)
    for n in after.nics:
        if (nic.locator and n.locator == nic.locator) or (not nic.locator and n.index == nic.index):
            return after, n
    raise Unmeasurable(f"interface {nic.label} is gone after the fix")


def kernel_choice(ctx: VerifyContext) -> KernelChoice:
    """The kernel the probe guests boot (``ctx.guest_kernel``, filled by the CLI) and where it came from."""
    return choice_for(ctx.guest_kernel, ctx.guest_modules)


def check_drivers(sides: dict[str, GuestSide], choice: KernelChoice) -> None:
    """:class:`Unmeasurable` naming the first side whose NIC driver the chosen kernel lacks (reads modules.dep only)."""
    for name, side in sides.items():
        release, missing = kernel_lacks(HostRoot(), nic_modules(side), choice.kernel, choice.modules_dir)
        if missing:
            raise Unmeasurable(lacks_line(f"side {name} ({side.nic_model} NIC)", missing, release, choice))


def plan_nic(subject: Subject, ctx: VerifyContext, plan: GuestExperiment) -> NicExperiment:
    f, guest, nic = subject.finding, subject.guest, subject.interface
    if guest is None or nic is None:
        raise Unmeasurable("the finding names no interface of an audited guest")
    if not isinstance(plan.job, NetJob):
        raise Unmeasurable("a NIC experiment runs a netload job")
    after_guest, after = fixed_nic(guest, nic, f.rule, ctx)
    host = HostRoot()  # the probe guests run on this machine, whatever --root audits
    a, b, notes = build_sides(knobs_of(nic, guest), knobs_of(after, after_guest), vhost_device=host.exists(VHOST_DEVICE),
                              cpus=len(os.sched_getaffinity(0)), guest_vcpus=after_guest.vcpus or 1, job=plan.job)
    if (nic.type or "bridge").lower() not in TAP_BACKED:
        notes.append(f"the interface is type {nic.type}; the probe guests' NIC is on a tap (a bridge port in a kvmtune "
                     "namespace), so the NIC's own part is measured, not that back end's")
    check_drivers({"A": a, "B": b}, kernel_choice(ctx))
    require_accel(f.rule, ctx)
    return NicExperiment(subject, a, b, plan.job, notes, plan.note)


# --------------------------------------------------------------------------- the measurement


def workload_name(job: NetJob) -> str:
    """netload's built-in workload for the job (``str-writex30k``, ``rr1c-1x1``; ``size`` bytes when given)."""
    if job.kind == "stream":
        return f"str-writex{job.size}" if job.size else "str-writex30k"
    if job.kind == "rr":
        return f"rr1c-{job.size}x{job.size}" if job.size else "rr1c-1x1"
    raise NetError(f"netload job kind {job.kind!r}: stream or rr")


def parse_netload(text: str, job: NetJob) -> float:
    """The job's figure from ``netload run --json``'s one document, strictly: MB/s for a stream, tx/s for rr."""
    try:
        doc = json.loads(text)
    except ValueError:
        raise KvmtuneError("netload printed no JSON document") from None
    if not isinstance(doc, dict):
        raise KvmtuneError("netload's JSON is not an object")
    err = doc.get("error")
    if err:
        message = err.get("message") if isinstance(err, dict) else err
        raise KvmtuneError(f"netload: {str(message)[:MAX_STDERR_LINE]}")
    try:
        m = netload_metrics(doc)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise KvmtuneError(f"netload's JSON lacks its summary ({exc!s:.80})") from None
    if m["errors"]:
        raise KvmtuneError(f"netload counted {m['errors']:.0f} errors")
    value = m["throughput_Bps"] / 1e6 if job.kind == "stream" else m["tps"]
    if not math.isfinite(value) or value <= 0:
        raise KvmtuneError("netload measured nothing (no bytes or transactions)")
    return value


class NetloadProbe:
    """netload in probe guest A or B against the namespace's server: one figure per sample."""

    def __init__(self, pair: GuestPair, net: GuestNet, job: NetJob, seconds: float) -> None:
        self.pair, self.net, self.job, self.seconds = pair, net, job, seconds
        self.metric = THROUGHPUT if job.kind == "stream" else TPS

    def argv(self, seconds: float) -> list[str]:
        return ["/bin/env", f"NETLOAD_TOKEN={self.net.token}", GUEST_NETLOAD, "run", "--workload", workload_name(self.job),
                "--users", str(self.job.streams), "--duration", f"{max(1, round(seconds * 1000))}ms",
                "--remote", self.net.server_address, "--connect-timeout", "10s", "-q", "--json"]

    def run(self, side: str, seconds: float) -> float:
        res = self.pair.exec(side, self.argv(seconds), timeout=seconds + EXEC_SLACK_S)
        if res.rc is None:
            raise KvmtuneError(f"probe guest {side}: netload did not finish within {seconds + EXEC_SLACK_S:.0f}s")
        if res.rc != 0:
            down = self.net.server_error()
            last = next((ln for ln in reversed(res.stderr.splitlines()) if ln.strip()), "no error output")
            raise KvmtuneError(f"probe guest {side}: netload exited {res.rc}: {down or last[:MAX_STDERR_LINE]}")
        return parse_netload(res.stdout, self.job)

    def sample(self, side: str) -> float:
        return self.run(side, self.seconds)


def configure(pair: GuestPair, net: GuestNet, side: str, model: str) -> None:
    """Give the side's NIC its address; one line when the guest has no NIC (its driver did not bind)."""
    listing = pair.exec(side, ["/bin/ls", "/sys/class/net"], timeout=30)
    if "eth0" not in listing.stdout.split():
        raise KvmtuneError(f"probe guest {side} has no eth0: the {model} driver did not bind to its NIC")
    for argv in net.guest_commands(side):
        res = pair.exec(side, argv, timeout=30)
        if res.rc != 0:
            raise KvmtuneError(f"probe guest {side}: {' '.join(argv)} failed: {res.stderr.strip()[:MAX_STDERR_LINE]}")


NIC_PROPERTIES = ("type", "mq", "rx_queue_size", "tx_queue_size")


def nic_device(pair: GuestPair, side: str) -> dict[str, Any]:
    """What QEMU was really given for the side's NIC (QOM properties of the device, read back over QMP)."""
    path = f"/machine/peripheral/{NIC_DEV}"
    out: dict[str, Any] = {}
    for prop in NIC_PROPERTIES:
        try:
            out[prop] = pair.qmp(side, "qom-get", {"path": path, "property": prop})
        except KvmtuneError:
            continue  # the property is virtio-net's only
    return out


@dataclass
class NicExperiment(TwoSides):
    subject: Subject
    a: GuestSide
    b: GuestSide
    job: NetJob
    assumed: list[str] = field(default_factory=list)
    note: str | None = None
    tier: str = "guest"

    @property
    def workload(self) -> str:
        return self.job.describe()

    def run(self, ctx: VerifyContext) -> Outcome:
        until = ctx.finding_until()  # the boot counts against the finding's cap
        choice = require_accel(self.subject.finding.rule, ctx)
        netload = find_netload(None, ctx.runner)
        kernel = kernel_choice(ctx)
        sides = {"A": self.a, "B": self.b}
        swept = sweep(ctx.runner, HostRoot(), ctx.workdir).line()  # a killed run's namespace, taps and QEMUs
        with GuestNet(sides, netload, runner=ctx.runner, workdir=ctx.workdir) as net, ProbePair(
            self.a, self.b, runner=ctx.runner, workdir=ctx.workdir, accel=choice.accel, host=HostRoot(),
            plumbing=(net.plumbing("A"), net.plumbing("B")), extra=(ExtraFile(netload, GUEST_NETLOAD),),
            kernel=kernel.kernel, modules_dir=kernel.modules_dir,
        ) as pair:
            for name, side in sides.items():
                assert side.nic_model is not None
                configure(pair, net, name, side.nic_model)
            devices = {name: nic_device(pair, name) for name in sides}
            probe = NetloadProbe(pair, net, self.job, ctx.seconds)
            for name in sides:  # the first connection of a side (ARP, the server's first accept) is not measured
                probe.run(name, min(0.5, ctx.seconds))
            samples = alternate(probe, ctx.repeat, ctx.deadline, settled=settles(probe.metric, ctx.threshold), until=until)
            accel, boot_s = pair.accel, pair.boot_s
        j = judge(samples, probe.metric, ctx.threshold)
        notes = [*self.assumed, f"probe guest kernel: {kernel.origin}"]
        if self.note:
            notes.append(self.note)
        if swept:
            ctx.notes.append(swept)
        details: dict[str, Any] = {
            "side_a": asdict(self.a), "side_b": asdict(self.b), "nic_a": devices["A"], "nic_b": devices["B"],
            "samples_a": samples.a, "samples_b": samples.b, "accel": accel, "boot_s": round(boot_s, 1),
            "workload": self.workload, "server": net.server_address, "kernel": kernel.kernel or "/boot",
        }
        if accel == "tcg":  # emulation measures QEMU's device models, not a KVM host: kept, never judged
            details.update({"verdict_under_emulation": j.verdict, "ratio": j.ratio,
                            "interval_95": list(j.interval) if j.interval else None})
            j = replace(j, verdict=NOT_COMPARABLE, rounds_to_settle=None)
        action = "nothing changed on the guest (two probe guests on taps in a kvmtune namespace, removed); apply with kvmtune fix"
        return Outcome(j, action, notes, details, samples.cut_short)
