"""Bad input and unavailable features: one clear line each, nothing left behind."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from net_helpers import assert_nothing_left, run_seeing_own_namespaces

from kvmtune.host.root import HostRoot
from kvmtune.lab.net import Endpoint, NetError, TopologySpec, make_topology
from kvmtune.lab.net.netns import Netns, check_address, require_net_admin
from kvmtune.runner import CommandResult, Runner


def _kvmtune(*args: str, prefix: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, sys.executable, "-m", "kvmtune", *args], capture_output=True, text=True,
                          timeout=120, check=False)


def _runid() -> str:
    return "t" + secrets.token_hex(4)


# --------------------------------------------------------------------------- no system needed


@pytest.mark.parametrize(
    "spec, message",
    [
        (TopologySpec("vde"), "unknown topology 'vde' (choose from bridge, ovs, macvtap, nat, user)"),
        (TopologySpec("bridge", mtu=70000), "MTU 70000 is out of range (68..65535)"),
        (TopologySpec("user", mtu=9000), "MTU 9000 is too large for QEMU user-mode networking"),
        (TopologySpec("bridge", hosts=3), "--hosts 3: must be 1 or 2"),
        (TopologySpec("bridge", pairs=0), "--pairs 0: must be 1..64"),
    ],
)
def test_bad_spec(spec: TopologySpec, message: str) -> None:
    with pytest.raises(NetError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_topology(spec)


@pytest.mark.parametrize("addr", ["10.0.2.15/24", "192.168.122.1", "198.20.0.1", "198.18.0.1/8", "fd00::1", "nonsense"])
def test_addresses_outside_the_benchmark_range_are_refused(addr: str) -> None:
    with pytest.raises(NetError):
        check_address(addr)


def test_addresses_inside_are_accepted() -> None:
    assert check_address("198.18.0.10/24") == "198.18.0.10/24"
    assert check_address("198.19.255.254") == "198.19.255.254"


def test_namespace_names_carry_the_prefix() -> None:
    with pytest.raises(NetError):
        Netns("blue", Runner())
    with pytest.raises(NetError):
        Netns("kvmtune-../x", Runner())


def test_not_root_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "status").write_text("Name:\tpython\nCapEff:\t0000000000000000\n")
    with pytest.raises(NetError, match=r"need root \(CAP_NET_ADMIN and CAP_SYS_ADMIN missing\)|network topologies need root"):
        require_net_admin(HostRoot(str(tmp_path)))
    (tmp_path / "proc" / "self" / "status").write_text("CapEff:\t000001ffffffffff\n")
    require_net_admin(HostRoot(str(tmp_path)))


def test_endpoint_netdev_arguments() -> None:
    tap = Endpoint("c0", "client", 0, 0, "kvmtune-ab12-h0", "tap", "52:54:00:4b:00:00", "198.18.0.10/24", None, 9000,
                   True, "198.18.0.10", ifname="kvtap-c0")
    assert tap.netdev_arg() == "tap,id=net0,ifname=kvtap-c0,script=no,downscript=no,vhost=on"
    assert tap.exec_prefix == ["ip", "netns", "exec", "kvmtune-ab12-h0"]
    assert tap.guest_commands()[0] == "ip link set dev eth0 mtu 9000"
    mvt = Endpoint("s0", "server", 0, 0, "kvmtune-ab12-h0", "macvtap", "52:54:00:4b:01:00", "198.18.0.110/24", None,
                   1500, False, "198.18.0.110", ifname="kvmvt-s0", chardev="/w/dev/x")
    with pytest.raises(NetError, match="needs the open"):
        mvt.netdev_arg()
    assert mvt.netdev_arg(fd=3) == "tap,id=net0,fd=3,vhost=off"
    user = Endpoint("s0", "server", 0, 1, "kvmtune-ab12-h1", "user", "52:54:00:4b:01:00", "198.18.200.15/24",
                    "198.18.200.2", 1500, False, "198.19.1.2", ports=(7200, 7201), hostfwd_address="198.19.1.2")
    assert user.netdev_arg() == (
        "user,id=net0,net=198.18.200.0/24,host=198.18.200.2,dhcpstart=198.18.200.15,ipv6=off,"
        "hostfwd=tcp:198.19.1.2:7200-:7200,hostfwd=tcp:198.19.1.2:7201-:7201"
    )


class _NoOvsRunner(Runner):
    def which(self, program: str) -> str | None:
        return None if program == "ovs-vswitchd" else super().which(program)


def test_ovs_unavailable_creates_nothing(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the root check comes first")
    runner = _NoOvsRunner()
    topo = make_topology(TopologySpec("ovs"), runner=runner, workdir=tmp_path)
    expected = r"^Open vSwitch unavailable: ovs-vswitchd not installed \(Debian package openvswitch-switch\)$"
    with pytest.raises(NetError, match=expected):
        topo.up()
    assert not any(c.argv[:3] == ("ip", "netns", "add") for c in runner.history)
    assert not (tmp_path / "net" / topo.runid).exists()


# --------------------------------------------------------------------------- with namespaces


class _NoMacvtapRunner(Runner):
    def run(self, argv: Sequence[str], *, timeout: float | None = None, env: Mapping[str, str] | None = None,
            input_text: str | None = None, cwd: str | None = None) -> CommandResult:
        if "macvtap" in argv and "add" in argv:
            return CommandResult(tuple(argv), 2, "", "Error: Unknown device type.\n", 0.0)
        return super().run(argv, timeout=timeout, env=env, input_text=input_text, cwd=cwd)


@pytest.mark.integration
@pytest.mark.usefixtures("netroot")
def test_macvtap_unavailable(workdir: Path) -> None:
    topo = make_topology(TopologySpec("macvtap", hosts=2), runner=_NoMacvtapRunner(), workdir=workdir, runid=_runid())
    with pytest.raises(NetError, match=r"^macvtap unavailable: this kernel has no macvtap support"):
        topo.up()
    assert_nothing_left(topo.runid, topo.rundir)


@pytest.mark.integration
@pytest.mark.usefixtures("netroot")
@pytest.mark.parametrize("kind", ["bridge", "ovs", "nat"])
def test_mtu_a_device_refuses(kind: str, workdir: Path) -> None:
    # veths and bridges take 65535, but a tap allows at most 65521
    topo = make_topology(TopologySpec(kind, mtu=65535, hosts=2), workdir=workdir, runid=_runid())
    expected = r"^MTU 65535 is too large for \S+ \((tun|OVS port)\) in kvmtune-\S+: it allows at most 65521$"
    with pytest.raises(NetError, match=expected):
        topo.up()
    assert_nothing_left(topo.runid, topo.rundir)


@pytest.mark.integration
@pytest.mark.usefixtures("netroot")
def test_ovs_kernel_datapath_absent(workdir: Path) -> None:
    if os.path.exists("/sys/module/openvswitch"):
        pytest.skip("the openvswitch module is loaded here")
    with pytest.raises(NetError, match="kernel datapath unavailable"):
        make_topology(TopologySpec("ovs", ovs_datapath="system"), workdir=workdir).up()
    assert not (workdir / "net").exists() or not any((workdir / "net").iterdir())


@pytest.mark.integration
def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    for args, text in [
        (("net", "check", "--topology", "vde"), "kvmtune: unknown topology 'vde' (choose from bridge, ovs, macvtap, nat, user)"),
        (("net", "up", "--topology", "user", "--mtu", "9000"), "kvmtune: MTU 9000 is too large for QEMU user-mode networking"),
    ]:
        argv = [sys.executable, "-m", "kvmtune", *args, "--workdir", str(tmp_path)]
        if os.geteuid() == 0:
            res, made = run_seeing_own_namespaces(argv, tmp_path / "namespaces")
            assert made == []
        else:
            res = _kvmtune(*argv[3:])
        assert res.returncode == 2
        assert res.stderr.count("\n") == 1 and res.stderr.startswith(text), res.stderr


@pytest.mark.integration
def test_cli_not_root_is_one_line(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root to drop to nobody with setpriv")
    tmp_path.chmod(0o777)
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
    listing = tmp_path.parent / f"{tmp_path.name}-namespaces"
    res, made = run_seeing_own_namespaces(
        [*nobody, sys.executable, "-m", "kvmtune", "net", "up", "--topology", "bridge", "--workdir", str(tmp_path)],
        listing)
    if "Permission denied" in res.stderr and "kvmtune" not in res.stderr.splitlines()[-1]:
        pytest.skip("nobody cannot read the source tree here")
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("kvmtune: network topologies need root (CAP_NET_ADMIN and CAP_SYS_ADMIN missing)")
    assert res.stderr.count("\n") == 1
    assert made == []
    assert not (tmp_path / "net").exists()
