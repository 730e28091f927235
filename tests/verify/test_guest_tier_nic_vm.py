"""The guest tier's NIC sides, booted for real (TCG on this machine): QEMU is given what each side says, netload moves
data from both, and nothing is left in the root namespace or behind the pair."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvmtune.audit.verifyplan import NIC_STREAM_JOB
from kvmtune.errors import KvmtuneError
from kvmtune.lab.guest import ExtraFile
from kvmtune.lab.net.netload import find_netload
from kvmtune.lab.probe.kernel import CACHED, FETCH_SCRIPT, KernelChoice, cached_kernel
from kvmtune.lab.probe.net import TAP, VHOST_DEVICE, GuestNet
from kvmtune.lab.probe.pair import NIC_DEV, ProbePair
from kvmtune.lab.probe.side import GuestSide
from kvmtune.runner import Runner
from kvmtune.verify.guest.nic import GUEST_NETLOAD, NetloadProbe, configure, nic_device

pytestmark = pytest.mark.integration

# PCI ids QEMU gives the models (hw/net/e1000.c, hw/net/rtl8139.c, virtio-net's transitional id)
PCI_IDS = {"e1000": (0x8086, 0x100E), "rtl8139": (0x10EC, 0x8139), "virtio": (0x1AF4, 0x1000)}


@pytest.fixture(scope="module")
def env() -> Iterator[tuple[Path, str, KernelChoice]]:
    if os.geteuid() != 0 or shutil.which("qemu-system-x86_64") is None:
        pytest.skip("needs root and qemu-system-x86_64")
    try:
        netload = find_netload(None, Runner())
    except KvmtuneError as exc:
        pytest.skip(str(exc))
    kernel = cached_kernel()
    if kernel is None:
        pytest.skip(f"no generic guest kernel (the cloud kernel has no e1000/rtl8139 driver): run {FETCH_SCRIPT}")
    assert kernel.origin == CACHED
    work = Path(tempfile.mkdtemp(prefix="kvtn-"))
    yield work, netload, kernel
    shutil.rmtree(work, ignore_errors=True)


def _namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _root_links() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]


def _pci_ids(pair: ProbePair, side: str) -> tuple[int, int]:
    for bus in pair.qmp(side, "query-pci"):
        for dev in bus["devices"]:
            if dev.get("qdev_id") == NIC_DEV:
                return dev["id"]["vendor"], dev["id"]["device"]
    raise AssertionError(f"side {side}: no {NIC_DEV} on the PCI bus")


@contextlib.contextmanager
def _booted(env: tuple[Path, str, KernelChoice], a: GuestSide, b: GuestSide) -> Iterator[tuple[GuestNet, ProbePair]]:
    """Both sides on their taps in a kvmtune namespace, booted with the generic kernel, under TCG."""
    work, netload, kernel = env
    with GuestNet({"A": a, "B": b}, netload, runner=Runner(), workdir=work) as net, ProbePair(
        a, b, runner=Runner(), workdir=work, accel="tcg", plumbing=(net.plumbing("A"), net.plumbing("B")),
        extra=(ExtraFile(netload, GUEST_NETLOAD),), kernel=kernel.kernel, modules_dir=kernel.modules_dir,
    ) as pair:
        yield net, pair


def test_e1000_and_virtio_sides_really_differ_and_both_move_data(env: tuple[Path, str, KernelChoice]) -> None:
    work = env[0]
    a, b = GuestSide(nic_model="e1000"), GuestSide(nic_model="virtio")
    before_links = set(_root_links())
    with _booted(env, a, b) as (net, pair):
        ns = net.netns.name
        assert ns not in _namespaces()  # held by a keeper process, not named in /run/netns
        inside = net.netns.path
        qemus = [s.run.proc for s in pair.sides.values() if s.run is not None and s.run.proc is not None]
        assert len(qemus) == 2 and {os.readlink(f"/proc/{q.pid}/ns/net") for q in qemus} == {os.readlink(inside)}
        assert _pci_ids(pair, "A") == PCI_IDS["e1000"] and _pci_ids(pair, "B") == PCI_IDS["virtio"]
        assert nic_device(pair, "A")["type"] == "e1000" and nic_device(pair, "B")["type"] == "virtio-net-pci"
        for side, s in (("A", a), ("B", b)):
            assert s.nic_model is not None
            configure(pair, net, side, s.nic_model)
        drivers = {side: pair.exec(side, ["/bin/cat", "/sys/class/net/eth0/device/uevent"], 30).stdout for side in "AB"}
        assert "DRIVER=e1000\n" in drivers["A"] and "DRIVER=virtio_net\n" in drivers["B"]  # the guest's own view
        probe = NetloadProbe(pair, net, NIC_STREAM_JOB, 0.5)
        assert probe.sample("A") > 0 and probe.sample("B") > 0
        taps = subprocess.run(["nsenter", f"--net={inside}", "ip", "-o", "link", "show"], capture_output=True, text=True,
                              check=True).stdout
        assert TAP["A"] in taps and TAP["B"] in taps
    assert ns not in _namespaces()
    assert not {ln for ln in _root_links() if ln.startswith(("kvtap", "kvbr"))} - before_links  # the root namespace untouched
    assert not (work / "net").exists() or list((work / "net").iterdir()) == []


def test_rtl8139_side_boots_with_its_driver(env: tuple[Path, str, KernelChoice]) -> None:
    a, b = GuestSide(nic_model="rtl8139", vcpus=2), GuestSide(nic_model="virtio", nic_queues=2, rx_queue_size=1024, vcpus=2)
    with _booted(env, a, b) as (net, pair):
        assert _pci_ids(pair, "A") == PCI_IDS["rtl8139"]
        dev_b = nic_device(pair, "B")
        assert dev_b["mq"] is True and dev_b["rx_queue_size"] == 1024
        configure(pair, net, "A", "rtl8139")
        configure(pair, net, "B", "virtio")
        queues = pair.exec("B", ["/bin/ls", "/sys/class/net/eth0/queues"], 30).stdout.split()
        assert {"rx-0", "rx-1", "tx-0", "tx-1"} <= set(queues)  # two queue pairs, as the -netdev and -device say


@pytest.mark.skipif(not os.path.exists(VHOST_DEVICE), reason=f"{VHOST_DEVICE} is missing on this host (modprobe vhost_net)")
def test_vhost_side_really_has_a_vhost_worker(env: tuple[Path, str, KernelChoice]) -> None:
    a, b = GuestSide(nic_model="virtio"), GuestSide(nic_model="virtio", vhost=True)
    with _booted(env, a, b) as (net, pair):
        pids = {side: pair.sides[side].run.proc.pid for side in "AB"}  # type: ignore[union-attr]
        comms = {Path(f"/proc/{p}/comm").read_text().strip() for p in os.listdir("/proc") if p.isdigit()
                 and Path(f"/proc/{p}/comm").exists()}
        assert f"vhost-{pids['B']}" in comms and f"vhost-{pids['A']}" not in comms
        configure(pair, net, "B", "virtio")
        assert NetloadProbe(pair, net, NIC_STREAM_JOB, 0.5).sample("B") > 0
