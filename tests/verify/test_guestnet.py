"""The guest tier's network, without QEMU: a kvmtune namespace with a bridge, a tap per side (multiqueue where the side
has queues), a netload server on the bridge's address; gone on exit, on an exception and on Ctrl-C."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from kvmtune.bench.net.guest import NETLOAD_PORT, find_netload
from kvmtune.bench.net.netns import NetError
from kvmtune.errors import KvmtuneError
from kvmtune.runner import Runner
from kvmtune.verify.guestnet import BRIDGE, SERVER_CIDR, TAP, VHOST_DEVICE, VHOST_MISSING, GuestNet
from kvmtune.verify.guestside import GuestSide

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


def _gone(net: GuestNet) -> None:
    assert net.host_ns(0).name not in _ip("netns", "list")
    assert not net.rundir.exists()
    assert net.server is not None and net.server.poll() is not None
    root = _ip("-o", "link", "show") + _ip("-o", "addr", "show")
    assert "kvtap-" not in root and BRIDGE not in root and "198.18." not in root  # the root namespace untouched


def test_namespace_taps_and_server(netload: str, tmp_path: Path) -> None:
    with GuestNet(SIDES, netload, runner=Runner(), workdir=tmp_path) as net:
        ns = net.host_ns(0).name
        assert ns.startswith("kvmtune-") and ns.endswith("-h0")
        a, b = (_ip("-n", ns, "-d", "link", "show", TAP[s]) for s in "AB")
        assert f"master {BRIDGE}" in a and f"master {BRIDGE}" in b
        assert "multi_queue" not in a and "multi_queue" in b  # QEMU opens the B tap with queues=4
        assert SERVER_CIDR in _ip("-n", ns, "addr", "show", "dev", BRIDGE)
        address = f"{SERVER_CIDR.split('/')[0]}:{NETLOAD_PORT}"
        for _ in range(100):  # netload serve is starting
            listening = subprocess.run(["ip", "netns", "exec", ns, "ss", "-Hltn"], capture_output=True, text=True).stdout
            if address in listening:
                break
            time.sleep(0.05)
        assert address in listening
        assert net.server_error() is None
        plumb = net.plumbing("B")
        assert plumb.wrapper == ("ip", "netns", "exec", ns)
        assert plumb.extra_args[0] == "-netdev" and "ifname=kvtap-b" in plumb.extra_args[1] and "queues=4" in plumb.extra_args[1]
    _gone(net)


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()], ids=["exception", "ctrl-c"])
def test_everything_goes_on_an_exception_and_on_ctrl_c(netload: str, tmp_path: Path, exc: BaseException) -> None:
    net = GuestNet(SIDES, netload, runner=Runner(), workdir=tmp_path)
    with pytest.raises(type(exc)), net:
        raise exc
    _gone(net)


@pytest.mark.skipif(os.path.exists(VHOST_DEVICE), reason=f"this host has {VHOST_DEVICE}")
def test_a_vhost_side_without_dev_vhost_net_makes_nothing(netload: str, tmp_path: Path) -> None:
    with pytest.raises(NetError, match=VHOST_MISSING.replace("(", r"\(").replace(")", r"\)")):
        GuestNet({"B": GuestSide(nic_model="virtio", vhost=True)}, netload, runner=Runner(), workdir=tmp_path).up()
    assert list(tmp_path.iterdir()) == []  # refused before its run directory (and so any namespace) was made
