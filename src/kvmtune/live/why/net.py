"""``kvmtune why``'s network causes: drops on the tap and on its bridge or OVS port, the vhost worker's CPU and run
delay, queues against vCPUs."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from kvmtune.host.parsers import parse_count
from kvmtune.host.root import HostRoot
from kvmtune.live.diagnose import Diagnosis
from kvmtune.live.model import GuestSample, NicCounters
from kvmtune.live.threads import Owner
from kvmtune.live.why.core import LIMITS, VCPU_WARN, CatalogueRule, WhyLine, WhyReport, rule_fix, verify_text
from kvmtune.live.why.tracker import Tracker
from kvmtune.runner import Runner

OVS_DB = "/run/openvswitch/db.sock"
_IFNAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,14}")  # a Linux interface name that cannot start an option
OVS_TIMEOUT_S = 2.0
# the rules a network cause names, from the catalogue
EMULATOR_ON_VCPUS = CatalogueRule("vcpu-pinning", "emulatorpin-on-vcpu-cpus")
MULTIQUEUE = CatalogueRule("net-multiqueue", "net-multiqueue-missing")
USER_NET = CatalogueRule("net-backend", "net-backend-user")


@dataclass
class Link:
    """What the host's side of one guest NIC shows: its switch, queues and the switch's drop counters."""

    master: str | None = None  # the Linux bridge, or the OVS bridge
    ovs: bool = False
    queues: int | None = None  # the tap's queues (/sys/class/net/TAP/queues/tx-*)
    counters: dict[str, int] = field(default_factory=dict)  # "bridge br0 rx_dropped" -> count


def _ovs_numbers(text: str) -> dict[str, int]:
    """``ovs-vsctl get Interface X statistics``: '{collisions=0, rx_dropped=3, …}'."""
    out: dict[str, int] = {}
    for part in text.strip().strip("{}").split(","):
        key, _, value = part.strip().partition("=")
        if (count := parse_count(value)) is not None:
            out[key] = count
    return out


def _ovs_lost(text: str) -> int | None:
    """``ovs-appctl dpctl/show``: 'lookups: hit:N missed:N lost:N' per datapath, summed."""
    total = None
    for line in text.splitlines():
        for part in line.split():
            if part.startswith("lost:") and (count := parse_count(part[5:])) is not None:
                total = (total or 0) + count
    return total


def read_link(host: HostRoot, runner: Runner | None, tap: str) -> Link:
    """One tap's switch side: a Linux bridge through sysfs; an OVS port through ovs-vsctl/ovs-appctl, asked only
    when OVS runs (its database socket exists) and a runner is given."""
    link = Link()
    if not _IFNAME.fullmatch(tap) or tap in (".", ".."):  # never an option to ovs-vsctl, never a path
        return link
    queues = [q for q in host.listdir(f"/sys/class/net/{tap}/queues") if q.startswith("tx-")]
    link.queues = len(queues) or None
    master = (host.readlink(f"/sys/class/net/{tap}/master") or "").rsplit("/", 1)[-1] or None
    if master == "ovs-system":
        link.ovs = True
        if runner is None or not host.exists(OVS_DB):
            return link
        br = runner.run(["ovs-vsctl", f"--timeout={OVS_TIMEOUT_S:.0f}", "port-to-br", tap], timeout=OVS_TIMEOUT_S + 1)
        link.master = br.stdout.strip() or None if br.ok else None
        st = runner.run(["ovs-vsctl", f"--timeout={OVS_TIMEOUT_S:.0f}", "get", "Interface", tap, "statistics"],
                        timeout=OVS_TIMEOUT_S + 1)
        numbers = _ovs_numbers(st.stdout) if st.ok else {}
        for key in ("rx_dropped", "tx_dropped"):
            if key in numbers:
                link.counters[f"OVS port {tap} {key}"] = numbers[key]
        dp = runner.run(["ovs-appctl", f"--timeout={OVS_TIMEOUT_S:.0f}", "dpctl/show"], timeout=OVS_TIMEOUT_S + 1)
        lost = _ovs_lost(dp.stdout) if dp.ok else None
        if lost is not None:
            link.counters["OVS datapath lost (all ports)"] = lost
        return link
    link.master = master
    if master:
        for key in ("rx_dropped", "tx_dropped"):
            value = host.read_optional(f"/sys/class/net/{master}/statistics/{key}")
            if (count := parse_count(value or "")) is not None:
                link.counters[f"bridge {master} {key}"] = count
    return link


def _vhost_delay(tr: Tracker) -> tuple[float, int | None]:
    """The vhost workers' run delay as a share of the interval, and the CPU the most delayed one last ran on."""
    delays = {tid: tr.vhost_last[tid][1] - first[1] for tid, first in tr.vhost_first.items() if tid in tr.vhost_last}
    if not delays:
        return 0.0, None
    worst = max(delays, key=lambda tid: delays[tid])
    return sum(delays.values()) / tr.interval_ns, tr.vhost_cpu.get(worst)


def _vhost_line(report: WhyReport, tr: Tracker, delay: float, cpu: int | None) -> None:
    users = {o: used for o, used in tr.use.get(cpu if cpu is not None else -1, {}).items()
             if not (o.kind == "vhost" and o.pid == tr.pid)}
    own = tr.own_vcpu_use.get(cpu if cpu is not None else -1, 0)
    if own:
        users[Owner("guest-vcpu", report.target.name, tr.pid, "its own vCPUs")] = own
    head = f"the vhost worker waited {delay:.0%} of the interval for a host CPU"
    if not users:
        evidence, who = f"it last ran on CPU {cpu}; no thread seen there", None
    else:
        who, used = max(users.items(), key=lambda kv: kv[1])
        evidence = f"it last ran on CPU {cpu}, which {who.label()} used for {used / tr.interval_ns:.0%} of the interval"
    if who is not None and who.pid == tr.pid:
        report.lines.append(WhyLine(
            "net", delay, f"{head}: waits for {report.target.name}'s own threads", evidence,
            "the guest's vhost worker shares host CPUs with its own vCPUs (libvirt puts vhost workers with the "
            "emulator threads)", EMULATOR_ON_VCPUS.id, rule_fix(EMULATOR_ON_VCPUS.id) or "pin the emulator threads away",
            verify_text(EMULATOR_ON_VCPUS.id, report.target.name, "the vhost worker's wait should fall below 5 %")))
        return
    report.lines.append(WhyLine(
        "net", delay, head + (f": waits for {who.name}" if who else ""), evidence,
        "other threads take the vhost worker's CPU", None,
        "give the guest's emulator threads (which carry its vhost workers) CPUs of their own (<emulatorpin>)",
        verify_text(None, report.target.name, "the vhost worker's wait should fall below 5 %"),
        no_rule="no rule covers a vhost worker crowded by other threads: the audit cannot see who runs beside it"))


def _drop_line(report: WhyReport, name: str, drops: dict[str, int], nic: dict[str, Any],
               diagnosis: Diagnosis | None, mismatch: bool) -> None:
    tap = drops.get("tap to guest", 0) + drops.get("tap from guest", 0)
    where = "; ".join(f"{k} +{v}" for k, v in drops.items() if v > 0)
    evidence = (f"{where}; txqueuelen {nic['txqueuelen']}; {nic['queues'] or '?'} queue(s) on {nic['vcpus']} vCPU(s); "
                f"vhost worker {nic['vhost_cpu']:.0%} of a CPU, waited {nic['vhost_delay']:.0%}")
    rule = diagnosis.rules[0] if diagnosis is not None and diagnosis.rules else None
    if rule is None and tap and mismatch:
        rule = MULTIQUEUE.id
    if tap:
        cause, no_rule = "drops on the tap", "no rule covers these drops: no finding of its configuration explains them"
        fix = (diagnosis.fix if diagnosis is not None and diagnosis.fix else rule_fix(rule) if rule else
               f"raise the tap's queue (ip link set {name} txqueuelen 10000), give the NIC queues = vCPUs")
    else:
        cause = "drops in the switch (the bridge or OVS), not on the tap"
        no_rule = "no rule covers drops in a bridge or OVS: the audit judges guest definitions, not the switch's state"
        fix = "look at the switch: its other ports, its flows (ovs-appctl dpctl/show), its MTU"
        rule = None
    report.lines.append(WhyLine(
        "net", None, f"NIC {name}: {sum(drops.values())} packets dropped", evidence, cause, rule, fix,
        verify_text(rule, report.target.name, "no more drops"), no_rule="" if rule else no_rule))


def net_lines(report: WhyReport, diagnoses: list[Diagnosis], tr: Tracker, a: GuestSample, b: GuestSample,
               links0: dict[str, Link], links1: dict[str, Link]) -> None:
    """Per NIC: drops on the tap and its bridge or OVS port, its queues against the vCPUs; the vhost worker's CPU and
    run delay."""
    vhost = sum(used for per_cpu in tr.use.values() for o, used in per_cpu.items()
                if o.kind == "vhost" and o.pid == tr.pid) / tr.interval_ns
    delay, delay_cpu = _vhost_delay(tr)
    vcpus = len(b.vcpus) or (b.guest.vcpus if b.guest is not None and b.guest.vcpus else 1)
    for name in sorted(b.nics):
        na, nb = a.nics.get(name) or NicCounters(), b.nics[name]
        la, lb = links0.get(name) or Link(), links1.get(name) or Link()
        drops = {"tap to guest": nb.rx_drop - na.rx_drop, "tap from guest": nb.tx_drop - na.tx_drop}
        drops.update({k: v - la.counters[k] for k, v in lb.counters.items() if k in la.counters})
        qlen = tr.host.read_optional(f"/sys/class/net/{name}/tx_queue_len")
        drops = {k: max(0, v) for k, v in drops.items()}
        nic: dict[str, Any] = {"nic": name, "txqueuelen": parse_count(qlen or ""),
               "vhost_cpu": vhost, "vhost_delay": delay, "vcpus": vcpus, "queues": lb.queues,
               "switch": "ovs" if lb.ovs else "bridge" if lb.master else None, "bridge": lb.master,
               "drops": drops}
        report.nics.append(nic)
        queues = lb.queues
        mismatch = queues is not None and ((vcpus >= 2 and queues == 1) or queues > vcpus)
        if sum(drops.values()) > 0:
            diagnosis = next((d for d in diagnoses if d.signal == f"net-drops {name}"), None)
            _drop_line(report, name, drops, nic, diagnosis, mismatch)
        elif mismatch and vhost >= LIMITS.vhost_busy:
            report.lines.append(WhyLine(
                "net", None, f"NIC {name}: {queues} queue(s) on {vcpus} vCPU(s) while its vhost worker was busy "
                f"{vhost:.0%} of a CPU", f"/sys/class/net/{name}/queues: {queues} tx queue(s)",
                "queue count against vCPUs: one vhost worker and one vCPU carry the NIC", MULTIQUEUE.id,
                rule_fix(MULTIQUEUE.id), verify_text(MULTIQUEUE.id, report.target.name, "the vhost load spreads")))
    if delay >= VCPU_WARN:
        _vhost_line(report, tr, delay, delay_cpu)
    for n in b.guest.nics if b.guest is not None else []:
        if n.type == "user":
            report.notes.append(f"net: NIC {n.index} is QEMU's user-mode network (slirp; {USER_NET.id}): no tap, bridge "
                                "or vhost worker to read, its packets are the work of QEMU's main loop")
