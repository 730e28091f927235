"""``kvmtune why``'s network, disk and memory parts on fixture /proc and /sys trees: drops on the tap, the bridge
and the OVS port, the vhost worker's run delay, queues against vCPUs, the backing device's diskstats, KSM and
hugepages. Each line names a rule id or says no rule covers it."""

from __future__ import annotations

import os
from pathlib import Path

from kvmtune.host.root import HostRoot
from kvmtune.live.diagnose import Diagnoser
from kvmtune.live.model import DiskCounters, GuestSample, NicCounters
from kvmtune.live.why.core import Target, WhyReport
from kvmtune.live.why.disk import DiskEdges, disk_extras
from kvmtune.live.why.memory import memory_lines
from kvmtune.live.why.net import net_lines, read_link
from kvmtune.live.why.tracker import Tracker
from kvmtune.model.guest import Disk, Guest, Nic
from kvmtune.runner import CommandResult

from .test_why_unit import qemu, thread, write

TARGET = Target("ca", "pid 100", "pid:100:ca", 100, None, False)


def nic_tree(root: Path, master: str, bridge_drops: int, queues: int) -> None:
    for q in range(queues):
        (root / f"sys/class/net/tap0/queues/tx-{q}").mkdir(parents=True, exist_ok=True)
        (root / f"sys/class/net/tap0/queues/rx-{q}").mkdir(parents=True, exist_ok=True)
    link = root / "sys/class/net/tap0/master"
    if not link.is_symlink():
        link.symlink_to(f"../../../devices/virtual/net/{master}")
    write(root, "/sys/class/net/tap0/tx_queue_len", "1000\n")
    write(root, f"/sys/class/net/{master}/statistics/rx_dropped", f"{bridge_drops}\n")
    write(root, f"/sys/class/net/{master}/statistics/tx_dropped", "0\n")


def guest(vcpus: int, tap_drops: int) -> GuestSample:
    g = GuestSample("pid:100:ca", "ca", "pid 100", 100, nics={"tap0": NicCounters(rx_drop=tap_drops)})
    g.guest = Guest(name="ca", origin="pid 100", origin_kind="cmdline", vcpus=vcpus)
    return g


def tracker(root: Path) -> Tracker:
    write(root, "/proc/stat", "cpu  1 0 0 1 0 0 0 0 0 0\n")
    tr = Tracker(HostRoot(str(root)), TARGET, {})
    tr.t1 = tr.t0 + 1.0
    return tr


def test_drops_on_the_bridge_are_the_switchs_and_no_rule_covers_them(tmp_path: Path) -> None:
    host = HostRoot(str(tmp_path))
    nic_tree(tmp_path, "br0", 5, 2)
    before = read_link(host, None, "tap0")
    nic_tree(tmp_path, "br0", 12, 2)
    after = read_link(host, None, "tap0")
    assert (after.master, after.ovs, after.queues) == ("br0", False, 2)
    report = WhyReport(TARGET, 1.0, "tcg")
    net_lines(report, [], tracker(tmp_path), guest(2, 0), guest(2, 0), {"tap0": before}, {"tap0": after})
    (line,) = report.lines
    assert line.what == "NIC tap0: 7 packets dropped" and "bridge br0 rx_dropped +7" in line.evidence, line
    assert "2 queue(s) on 2 vCPU(s)" in line.evidence and "txqueuelen 1000" in line.evidence
    assert line.rule is None and line.no_rule.startswith("no rule covers drops in a bridge or OVS"), line
    assert report.nics[0]["switch"] == "bridge" and report.nics[0]["drops"]["bridge br0 rx_dropped"] == 7


def test_drops_on_a_single_queue_tap_of_a_multi_vcpu_guest_name_the_queue_rule(tmp_path: Path) -> None:
    nic_tree(tmp_path, "br0", 0, 1)
    link = read_link(HostRoot(str(tmp_path)), None, "tap0")
    report = WhyReport(TARGET, 1.0, "tcg")
    net_lines(report, [], tracker(tmp_path), guest(4, 10), guest(4, 40), {"tap0": link}, {"tap0": link})
    (line,) = report.lines
    assert line.rule == "KVM-NET-008" and "tap to guest +30" in line.evidence and "1 queue(s) on 4 vCPU(s)" in line.evidence
    assert line.cause == "drops on the tap"


class FakeOvs:
    """Answers ovs-vsctl and ovs-appctl as a running Open vSwitch does; records what was asked."""

    def __init__(self, dropped: int) -> None:
        self.dropped = dropped
        self.asked: list[list[str]] = []

    def run(self, argv: list[str], **_: object) -> CommandResult:
        self.asked.append(argv)
        if "port-to-br" in argv:
            out = "ovsbr0\n"
        elif "statistics" in argv:
            out = f"{{collisions=0, rx_bytes=100, rx_dropped=0, tx_dropped={self.dropped}}}\n"
        else:
            out = "system@ovs-system:\n  lookups: hit:10 missed:2 lost:3\n  flows: 2\n"
        return CommandResult(tuple(argv), 0, out, "", 0.01)


def test_an_ovs_port_is_asked_through_the_runner_only_when_ovs_runs(tmp_path: Path) -> None:
    host = HostRoot(str(tmp_path))
    nic_tree(tmp_path, "ovs-system", 0, 1)
    silent = FakeOvs(0)
    link = read_link(host, silent, "tap0")  # type: ignore[arg-type]
    assert link.ovs and link.counters == {} and silent.asked == []  # no database socket: OVS does not run
    write(tmp_path, "/run/openvswitch/db.sock", "")
    hostile = FakeOvs(0)
    (tmp_path / "sys/class/net/--db=x").mkdir()
    (tmp_path / "sys/class/net/--db=x/master").symlink_to("../../../devices/virtual/net/ovs-system")
    assert read_link(host, hostile, "--db=x").counters == {} and hostile.asked == []  # a name is never an option
    before = read_link(host, FakeOvs(2), "tap0")  # type: ignore[arg-type]
    after = read_link(host, FakeOvs(9), "tap0")  # type: ignore[arg-type]
    assert after.master == "ovsbr0" and after.counters["OVS port tap0 tx_dropped"] == 9
    assert after.counters["OVS datapath lost (all ports)"] == 3
    report = WhyReport(TARGET, 1.0, "tcg")
    net_lines(report, [], tracker(tmp_path), guest(1, 0), guest(1, 0), {"tap0": before}, {"tap0": after})
    (line,) = report.lines
    assert "OVS port tap0 tx_dropped +7" in line.evidence and line.rule is None and report.nics[0]["switch"] == "ovs"


def test_a_vhost_worker_waiting_behind_its_own_vcpu_names_the_emulator_pin_rule(tmp_path: Path) -> None:
    host = HostRoot(str(tmp_path))
    write(tmp_path, "/proc/stat", "cpu  1 0 0 1 0 0 0 0 0 0\n")
    qemu(tmp_path, 100, "ca")
    for step in (0, 1):
        thread(tmp_path, 100, 101, "CPU 0/KVM", 10 + 80 * step, 0)
        thread(tmp_path, 300, 300, "vhost-100", 5 + 10 * step, 0, delay_ns=400_000_000 * step, kernel=True)
        if step == 0:
            tr = Tracker(host, TARGET, {0: 101})
        tr.tick()
    tr.t1 = tr.t0 + 1.0
    report = WhyReport(TARGET, 1.0, "tcg")
    net_lines(report, [], tr, guest(1, 0), guest(1, 0), {}, {})
    (line,) = report.lines
    assert line.what == "the vhost worker waited 40% of the interval for a host CPU: waits for ca's own threads", line
    assert line.rule == "KVM-CPU-021" and "ca (pid 100, its own vCPUs) used for 80%" in line.evidence, line


def test_the_backing_devices_diskstats_and_the_queue_rule(tmp_path: Path) -> None:
    host = HostRoot(str(tmp_path))
    write(tmp_path, "/img/disk.raw", "x")
    dev = os.stat(tmp_path / "img/disk.raw").st_dev
    link = tmp_path / f"sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    link.parent.mkdir(parents=True)
    link.symlink_to("../../devices/virtual/block/vdz")
    edges = DiskEdges()
    write(tmp_path, "/proc/diskstats", " 252 0 vdz 100 0 800 50 100 0 800 150 0 100 200\n")
    edges.read(host, first=True)
    write(tmp_path, "/proc/diskstats", " 252 0 vdz 200 0 1600 1050 200 0 1600 1150 1 1050 2200\n")
    edges.read(host, first=False)
    edges.t1 = edges.t0 + 1.0
    g = GuestSample("pid:100:ca", "ca", "pid 100", 100, disks={"d0": DiskCounters()})
    g.guest = Guest(name="ca", origin="pid 100", origin_kind="cmdline", vcpus=4, machine="pc-q35-8.2",
                    disks=[Disk("d0", bus="virtio", queues=1, source="/img/disk.raw", source_type="file")])
    findings = Diagnoser(host).findings_for(g)
    report = WhyReport(TARGET, 1.0, "tcg")
    report.disks.append({"disk": "d0", "read_iops": 100.0, "write_iops": 100.0, "queue_depth": 2.0})
    disk_extras(report, host, g, edges, findings)
    assert report.disks[0]["host_device"] == {"device": "vdz", "await_ms": 10.0, "util": 0.95, "ios": 200}
    busy, queues = sorted(report.lines, key=lambda x: x.rule or "")
    assert busy.what == "disk d0: its backing device vdz was 95% busy on the host (await 10.0 ms)", busy
    assert busy.rule is None and busy.no_rule.startswith("no rule covers a saturated host device")
    assert queues.rule == "KVM-STO-022" and "queues=1 on 4 vCPUs" in queues.what, queues


def test_ksm_share_and_a_large_guest_without_hugepages(tmp_path: Path) -> None:
    host = HostRoot(str(tmp_path))
    page = os.sysconf("SC_PAGE_SIZE")
    write(tmp_path, "/proc/100/status", "VmSwap:\t0 kB\nHugetlbPages:\t0 kB\n")
    write(tmp_path, "/proc/100/smaps_rollup", "Anonymous:\t33554432 kB\nAnonHugePages:\t0 kB\n")
    write(tmp_path, "/proc/100/ksm_merging_pages", f"{8 * 1024 * 1024 * 1024 // page}\n")
    g = GuestSample("pid:100:ca", "ca", "pid 100", 100)
    g.guest = Guest(name="ca", origin="pid 100", origin_kind="cmdline", vcpus=4, memory_kib=32 * 1024 * 1024)
    report = WhyReport(TARGET, 1.0, "tcg")
    memory_lines(report, host, [], None, Diagnoser(host).findings_for(g))
    assert report.memory["ksm_kib"] == 8 * 1024 * 1024 and report.memory["ksm_share"] == 0.25
    assert report.memory["hugetlb_kib"] == 0
    ksm, huge = report.lines
    assert ksm.what == "KSM merges 25% of the guest's memory" and ksm.rule is None and ksm.no_rule, ksm
    assert huge.rule == "KVM-MEM-004" and huge.what.startswith("a large guest backed by small pages"), huge


def test_ksm_running_without_a_per_process_counter_is_a_note(tmp_path: Path) -> None:
    host = HostRoot(str(tmp_path))
    write(tmp_path, "/proc/100/status", "VmSwap:\t0 kB\n")
    write(tmp_path, "/sys/kernel/mm/ksm/run", "1\n")
    report = WhyReport(TARGET, 1.0, "tcg")
    memory_lines(report, host, [])
    assert report.notes == ["KSM: runs, but /proc/100/ksm_merging_pages is not readable (Linux before 6.1): the "
                            "guest's share is not known"]


def test_a_user_mode_nic_has_nothing_host_side_to_read_and_says_so(tmp_path: Path) -> None:
    g = GuestSample("pid:100:ca", "ca", "pid 100", 100)
    g.guest = Guest(name="ca", origin="pid 100", origin_kind="cmdline", vcpus=1, nics=[Nic(0, type="user")])
    report = WhyReport(TARGET, 1.0, "tcg")
    net_lines(report, [], tracker(tmp_path), g, g, {}, {})
    assert report.lines == [] and report.notes == [
        "net: NIC 0 is QEMU's user-mode network (slirp; KVM-NET-003): no tap, bridge or vhost worker to read, its "
        "packets are the work of QEMU's main loop"]


def test_a_machine_type_before_5_2_names_kvm_sto_011_for_a_busy_disk(tmp_path: Path) -> None:
    host = HostRoot(str(tmp_path))
    g = GuestSample("pid:100:ca", "ca", "pid 100", 100, disks={"vda": DiskCounters()})
    g.guest = Guest(name="ca", origin="pid 100", origin_kind="cmdline", vcpus=4, machine="pc-i440fx-4.2",
                    disks=[Disk("vda", bus="virtio", source="rbd:pool/img", source_type="network")])
    report = WhyReport(TARGET, 1.0, "tcg")
    report.disks.append({"disk": "vda", "read_iops": 50.0, "write_iops": 0.0, "queue_depth": 3.0})
    disk_extras(report, host, g, DiskEdges(), Diagnoser(host).findings_for(g))
    (line,) = report.lines
    assert line.rule == "KVM-STO-011" and "1 queue for vda (4 vCPUs)" in line.what, line
    assert report.disks[0]["host_device"] is None and report.disks[0]["queues"] == 1  # a network disk: no host device


def test_why_runs_whole_on_a_captured_tree_reading_only_through_the_host_root(tmp_path: Path) -> None:
    """Issue 44 item 3: every host read of why goes through HostRoot, so the whole command runs on a tree (a capture):
    the guest, its vCPU thread and its affinity come from the tree, and what it read are host paths of that tree."""
    from kvmtune.live.sources import Sampler
    from kvmtune.live.why import why

    from .test_why_unit import crowd

    crowd(tmp_path, 0)
    crowd(tmp_path, 1)
    host = HostRoot(str(tmp_path))
    report = why(host, Sampler(host, []), "ca", 0.0)
    assert (report.target.name, report.target.pid) == ("ca", 100)
    assert [(v["vcpu"], v["tid"], v["allowed_cpus"]) for v in report.vcpus] == [(0, 101, [0])]
    assert "/proc/100/task/101/status" in host.reads and "/proc/100/task/101/schedstat" in host.reads
    assert all(p.startswith(("/proc/", "/sys/", "/run/", "/etc/", "/dev/")) for p in host.reads), host.reads
    assert report.lines == []  # a tree does not move: no interval, no wait
