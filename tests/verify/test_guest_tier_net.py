"""The guest tier's network, without QEMU: a kvmtune namespace with a bridge, a tap per side (multiqueue where the side
has queues), a netload server on the bridge's address; held by a keeper process, not named in /run/netns; gone on exit,
on an exception and on Ctrl-C."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from kvmtune.errors import KvmtuneError
from kvmtune.lab.net.netload import NETLOAD_PORT, find_netload
from kvmtune.lab.net.netns import HeldNetns, NetError
from kvmtune.lab.probe.net import BRIDGE, SERVER_CIDR, TAP, VHOST_DEVICE, VHOST_MISSING, GuestNet
from kvmtune.lab.probe.side import GuestSide
from kvmtune.runner import Runner

pytestmark = pytest.mark.integration
SIDES = {"A": GuestSide(nic_model="e1000"), "B": GuestSide(nic_model="virtio", nic_queues=4)}


@pytest.fixture
def netload() -> str:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to build namespaces")
    try:
        return find_netload(None, Runner())
    except KvmtuneError as exc:
        pytest.skip(str(exc))


def _ip(*argv: str) -> str:
    return subprocess.run(["ip", *argv], capture_output=True, text=True, check=True).stdout


def _inside(net: GuestNet, *argv: str) -> str:
    return subprocess.run(["nsenter", f"--net={net.netns.path}", *argv], capture_output=True, text=True, check=True).stdout


def _holders(link: str) -> list[int]:
    """Processes whose network namespace is ``link`` (``net:[inode]``)."""
    out = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.readlink(f"/proc/{entry}/ns/net") == link:
                out.append(int(entry))
        except OSError:
            continue
    return out


def _gone(net: GuestNet, link: str | None = None) -> None:
    assert net.host_ns(0).name not in _ip("netns", "list")
    if link is not None:
        assert _holders(link) == []  # no process left in it (the keeper included): the kernel removes it
    assert not net.rundir.exists()
    assert net.server is not None and net.server.poll() is not None
    root = _ip("-o", "link", "show") + _ip("-o", "addr", "show")
    assert "kvtap-" not in root and BRIDGE not in root and "198.18." not in root  # the root namespace untouched


def test_namespace_taps_and_server(netload: str, tmp_path: Path) -> None:
    with GuestNet(SIDES, netload, runner=Runner(), workdir=tmp_path) as net:
        held = net.netns
        assert isinstance(held, HeldNetns) and held.keeper_pid is not None
        ns = held.name
        assert ns.startswith("kvmtune-") and ns.endswith("-h0")
        assert ns not in _ip("netns", "list")  # no name in /run/netns: nothing a killed run could leave there
        link = os.readlink(held.path)
        assert link != os.readlink("/proc/self/ns/net")
        a, b = (_inside(net, "ip", "-d", "link", "show", TAP[s]) for s in "AB")
        assert f"master {BRIDGE}" in a and f"master {BRIDGE}" in b
        assert "multi_queue" not in a and "multi_queue" in b  # QEMU opens the B tap with queues=4
        assert SERVER_CIDR in _inside(net, "ip", "addr", "show", "dev", BRIDGE)
        address = f"{SERVER_CIDR.split('/')[0]}:{NETLOAD_PORT}"
        for _ in range(100):  # netload serve is starting
            listening = _inside(net, "ss", "-Hltn")
            if address in listening:
                break
            time.sleep(0.05)
        assert address in listening
        assert net.server_error() is None
        assert net.server is not None and os.readlink(f"/proc/{net.server.pid}/ns/net") == link  # the server is inside
        plumb = net.plumbing("B")
        assert plumb.wrapper == ("nsenter", f"--net=/proc/{held.keeper_pid}/ns/net", "--")
        assert plumb.extra_args[0] == "-netdev" and "ifname=kvtap-b" in plumb.extra_args[1] and "queues=4" in plumb.extra_args[1]
    _gone(net, link)
    with pytest.raises(NetError, match="the process holding the namespace is gone"):
        net.plumbing("A")  # never a stale /proc/<pid> path once the keeper is gone


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()], ids=["exception", "ctrl-c"])
def test_everything_goes_on_an_exception_and_on_ctrl_c(netload: str, tmp_path: Path, exc: BaseException) -> None:
    net = GuestNet(SIDES, netload, runner=Runner(), workdir=tmp_path)
    with pytest.raises(type(exc)), net:
        link = os.readlink(net.netns.path)
        raise exc
    _gone(net, link)


@pytest.mark.skipif(os.path.exists(VHOST_DEVICE), reason=f"this host has {VHOST_DEVICE}")
def test_a_vhost_side_without_dev_vhost_net_makes_nothing(netload: str, tmp_path: Path) -> None:
    with pytest.raises(NetError, match=VHOST_MISSING.replace("(", r"\(").replace(")", r"\)")):
        GuestNet({"B": GuestSide(nic_model="virtio", vhost=True)}, netload, runner=Runner(), workdir=tmp_path).up()
    assert list(tmp_path.iterdir()) == []  # refused before its run directory (and so any namespace) was made


def test_a_dead_keeper_is_never_entered_by_a_stale_pid(netload: str, tmp_path: Path) -> None:
    """The keeper killed from outside: it stays an unreaped zombie (its pid cannot be reused), nothing more enters by
    its /proc path, and teardown still stops the server and leaves nothing."""
    import signal

    net = GuestNet(SIDES, netload, runner=Runner(), workdir=tmp_path)
    with pytest.raises(NetError, match="the process holding the namespace is gone"), net:
        link = os.readlink(net.netns.path)
        pid = net.netns.keeper_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        for _ in range(200):
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
            time.sleep(0.01)
        assert Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"  # not reaped: still our pid
        assert net.server is not None and net.server.poll() is None  # the server still holds the namespace
        net.plumbing("A")
    _gone(net, link)
