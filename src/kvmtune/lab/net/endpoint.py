"""What a guest network topology is asked for and what it hands each guest: :class:`TopologySpec`, and one
:class:`Endpoint` per guest NIC (where QEMU runs, its ``-netdev`` and ``-device`` arguments, the address, gateway and
MTU the guest configures). :mod:`kvmtune.lab.net.topology` builds the host side of each kind.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, assert_never

from kvmtune.lab.net.netns import NetError, check_mtu
from kvmtune.qemuopts import Value, keyval

TOPOLOGIES = ("bridge", "ovs", "macvtap", "nat", "user")
MAX_PAIRS = 64
SWITCH = "kvsw0"  # the veth "physical switch" end in each host namespace
GUEST_DEV = "eth0"  # attach=netns: the stand-in guest's NIC inside its own namespace
USER_PORT_BASE = 7200
SLIRP_NET, SLIRP_GUEST, SLIRP_HOST = "198.18.200.0/24", "198.18.200.15/24", "198.18.200.2"


@dataclass(frozen=True)
class TopologySpec:
    kind: str
    pairs: int = 1
    hosts: int = 1
    mtu: int = 1500
    txqueuelen: int | None = None
    ovs_datapath: str = "auto"  # auto | system | netdev
    vhost: str = "auto"  # auto | on | off
    user_ports: int = 2  # user-mode servers: ports forwarded per server (control + data)
    # tap: a tap (or macvtap) per guest, for QEMU; netns: the datapath tier's namespace twin of each guest,
    # a veth (or macvlan) whose host end sits where the tap would, its other end eth0 in a namespace of its own
    attach: str = "tap"

    def validate(self) -> None:
        if self.kind not in TOPOLOGIES:
            raise NetError(f"unknown topology {self.kind!r} (choose from {', '.join(TOPOLOGIES)})")
        if not 1 <= self.pairs <= MAX_PAIRS:
            raise NetError(f"--pairs {self.pairs}: must be 1..{MAX_PAIRS}")
        if self.hosts not in (1, 2):
            raise NetError(f"--hosts {self.hosts}: must be 1 or 2")
        check_mtu(self.mtu)
        if self.kind == "user" and self.mtu != 1500:
            raise NetError(f"MTU {self.mtu} is too large for QEMU user-mode networking: slirp's MTU is fixed at 1500")
        if self.txqueuelen is not None and not 0 <= self.txqueuelen <= 1_000_000:
            raise NetError(f"txqueuelen {self.txqueuelen}: must be 0..1000000")
        if self.vhost not in ("auto", "on", "off"):
            raise NetError(f"vhost {self.vhost!r}: choose auto, on or off")
        if not 1 <= self.user_ports <= 10:
            raise NetError(f"user_ports {self.user_ports}: must be 1..10")
        if self.attach not in ("tap", "netns"):
            raise NetError(f"attach {self.attach!r}: choose tap or netns")
        if self.attach == "netns" and self.kind == "user":
            raise NetError(
                "topology user is QEMU's own user-mode network (slirp): without QEMU there is no datapath to measure; "
                "use --tier guest for it"
            )


class Backend(StrEnum):
    """How a guest NIC reaches the host. What differs per kind (QEMU's -netdev, the fd QEMU needs, the
    stand-in relay's side, fixed forwarded ports) is decided in :class:`Endpoint` only."""

    TAP = "tap"
    MACVTAP = "macvtap"
    USER = "user"


@dataclass(frozen=True)
class Endpoint:
    """One guest NIC's attachment point, and what the guest must configure."""

    name: str  # c0, s0, c1, …
    role: str  # client | server
    pair: int
    host: int
    netns: str  # QEMU must run here (``ip netns exec``)
    backend: Backend
    mac: str
    address: str  # the guest's CIDR
    gateway: str | None
    mtu: int
    vhost: bool
    connect_address: str  # servers: the address a client dials; clients: their own address
    ifname: str | None = None  # tap or macvtap device in ``netns``
    chardev: str | None = None  # macvtap: the /dev/tapN node kvmtune made in its run directory
    ports: tuple[int, ...] = ()  # user-mode servers: forwarded TCP ports (same number inside and outside)
    hostfwd_address: str | None = None  # user-mode servers: where the ports are forwarded
    # attach=netns: the namespace whose eth0 stands where the guest's NIC would (veth peer of the tap's
    # place, or a macvlan for macvtap); the load generator runs there, no QEMU
    guest_netns: str | None = None

    @property
    def ip(self) -> str:
        return self.address.split("/", 1)[0]

    @property
    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns]

    def __post_init__(self) -> None:
        object.__setattr__(self, "backend", Backend(self.backend))  # ValueError for a kind that does not exist

    @property
    def needs_chardev_fd(self) -> bool:
        """macvtap: QEMU gets the /dev/tapN node as an open fd (the caller opens :attr:`chardev`)."""
        return self.backend is Backend.MACVTAP

    @property
    def fixed_ports_only(self) -> bool:
        """user-mode (slirp) forwards only the fixed :attr:`ports`, so data connections must use them."""
        return self.backend is Backend.USER

    def relay_side(self) -> str | None:
        """The host side a stand-in relay attaches to (``relay.py --a``); None for user mode, which needs a QEMU."""
        match self.backend:
            case Backend.TAP:
                return f"tap:{self.ifname}"
            case Backend.MACVTAP:
                return f"chardev:{self.chardev}"
            case Backend.USER:
                return None
            case _:
                assert_never(self.backend)

    def netdev_arg(self, netdev_id: str = "net0", fd: int | None = None) -> str:
        """The ``-netdev`` value. macvtap needs ``fd``: the caller opens :attr:`chardev` and passes it to QEMU."""
        match self.backend:
            case Backend.TAP:
                pairs: list[tuple[str, Value | None]] = [("id", netdev_id), ("ifname", self.ifname), ("script", "no"),
                                                         ("downscript", "no")]
                first = "tap"
            case Backend.MACVTAP:
                if fd is None:
                    raise NetError(f"endpoint {self.name}: macvtap needs the open {self.chardev} passed as fd=")
                pairs, first = [("id", netdev_id), ("fd", fd)], "tap"
            case Backend.USER:
                pairs = [("id", netdev_id), ("net", SLIRP_NET), ("host", SLIRP_HOST), ("dhcpstart", self.ip),
                         ("ipv6", False)]
                pairs += [("hostfwd", f"tcp:{self.hostfwd_address}:{int(port)}-:{int(port)}") for port in self.ports]
                return keyval(*pairs, first="user")
            case _:
                assert_never(self.backend)
        return keyval(*pairs, ("vhost", self.vhost), first=first)

    def guest_commands(self, dev: str = "eth0") -> list[str]:
        """busybox ``ip`` commands that configure the guest side."""
        cmds = [f"ip link set dev {dev} mtu {self.mtu}", f"ip addr add {self.address} dev {dev}", f"ip link set dev {dev} up"]
        if self.gateway:
            cmds.append(f"ip route add default via {self.gateway}")
        return cmds

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ports"] = list(self.ports)
        return d
