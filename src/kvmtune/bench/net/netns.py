"""Network namespaces kvmtune owns, and the guard rails around them.

Every command that changes network state goes through :class:`Netns`, which
always names its namespace (``ip -n NAME …`` or ``ip netns exec NAME …``), so
nothing can land in the root namespace by accident. Namespace names start with
:data:`PREFIX`; addresses must lie in :data:`ADDRESS_SPACE` (RFC 2544's
benchmarking range), which :func:`check_address` enforces.

A live run holds an exclusive ``flock`` on each of its namespace files
(``/run/netns/NAME``). The kernel drops the lock when the owner dies, even by
SIGKILL, so ``kvmtune net cleanup`` can tell a killed run's leftovers from a
run still in progress.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from kvmtune.errors import KvmtuneError
from kvmtune.host.root import HostRoot
from kvmtune.runner import CommandResult, Runner

PREFIX = "kvmtune-"
ADDRESS_SPACE = ipaddress.ip_network("198.18.0.0/15")
NETNS_DIR = "/run/netns"
MIN_MTU, MAX_MTU = 68, 65535
CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21
_NAME_RE = re.compile(r"^kvmtune-[a-z0-9][a-z0-9-]{0,40}$")


class NetError(KvmtuneError):
    """A network setup step failed; the message is one line."""


def check_address(addr: str) -> str:
    """Return ``addr`` when it (an address or CIDR) lies in 198.18.0.0/15, else raise."""
    try:
        iface = ipaddress.ip_interface(addr)
    except ValueError:
        raise NetError(f"{addr!r}: not an IPv4 address") from None
    if iface.version != 4 or iface.ip not in ADDRESS_SPACE or (iface.network.prefixlen < ADDRESS_SPACE.prefixlen):
        raise NetError(f"{addr}: outside {ADDRESS_SPACE}, the only range kvmtune uses")
    return addr


def check_mtu(mtu: int) -> int:
    if not MIN_MTU <= mtu <= MAX_MTU:
        raise NetError(f"MTU {mtu} is out of range ({MIN_MTU}..{MAX_MTU})")
    return mtu


def require_net_admin(host: HostRoot) -> None:
    """Raise unless this process may create namespaces and links (CAP_NET_ADMIN + CAP_SYS_ADMIN)."""
    status = host.read_optional("/proc/self/status") or ""
    m = re.search(r"^CapEff:\s*([0-9a-fA-F]+)", status, re.M)
    caps = int(m.group(1), 16) if m else 0
    missing = [n for n, bit in (("CAP_NET_ADMIN", CAP_NET_ADMIN), ("CAP_SYS_ADMIN", CAP_SYS_ADMIN)) if not caps >> bit & 1]
    if missing:
        raise NetError(
            f"network topologies need root ({' and '.join(missing)} missing): "
            "run kvmtune as root to create its network namespaces"
        )


def list_namespaces(runner: Runner) -> list[str]:
    """Names from ``ip netns list`` (all of them; callers filter by prefix)."""
    res = runner.run(["ip", "netns", "list"], timeout=30)
    if not res.ok:
        raise NetError(f"cannot list network namespaces: {res.describe_failure()}")
    return [line.split()[0] for line in res.stdout.splitlines() if line.strip()]


def namespace_pids(runner: Runner, name: str) -> list[int]:
    res = runner.run(["ip", "netns", "pids", name], timeout=30)
    return [int(p) for p in res.stdout.split() if p.isdigit()] if res.ok else []


def namespace_is_locked(name: str) -> bool:
    """True when a live kvmtune process holds this namespace's lock."""
    try:
        fd = os.open(os.path.join(NETNS_DIR, name), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


@dataclass
class Netns:
    """One namespace kvmtune created. ``ip``/``exec`` never reach another namespace."""

    name: str
    runner: Runner
    _lock_fd: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise NetError(f"{self.name!r}: kvmtune namespaces are named {PREFIX}<run>-<role>")

    # -- lifecycle ---------------------------------------------------------------

    def create(self) -> None:
        res = self.runner.run(["ip", "netns", "add", self.name], timeout=30)
        if not res.ok:
            raise NetError(f"cannot create network namespace {self.name}: {res.describe_failure()}")
        try:
            fd = os.open(os.path.join(NETNS_DIR, self.name), os.O_RDONLY | os.O_CLOEXEC)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._lock_fd = fd
        except OSError as exc:
            raise NetError(f"{NETNS_DIR}/{self.name}: cannot lock the new namespace ({exc.strerror})") from None
        self.ip("link", "set", "lo", "up")

    def release_lock(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = None

    def delete(self) -> CommandResult:
        self.release_lock()
        return self.runner.run(["ip", "netns", "del", self.name], timeout=30)

    # -- commands ----------------------------------------------------------------

    @property
    def exec_prefix(self) -> list[str]:
        """Prefix an argv with this to run it inside the namespace (QEMU, daemons)."""
        return ["ip", "netns", "exec", self.name]

    def ip(self, *args: str, check: bool = True, timeout: float = 30) -> CommandResult:
        res = self.runner.run(["ip", "-n", self.name, *args], timeout=timeout)
        if check and not res.ok:
            raise NetError(f"{self.name}: {res.describe_failure()}")
        return res

    def exec(self, *argv: str, check: bool = True, timeout: float = 60, input_text: str | None = None) -> CommandResult:
        res = self.runner.run([*self.exec_prefix, *argv], timeout=timeout, input_text=input_text)
        if check and not res.ok:
            raise NetError(f"{self.name}: {res.describe_failure()}")
        return res

    def sysctl(self, key: str, value: str) -> None:
        """Set a per-namespace sysctl (``net.*`` keys only)."""
        if not key.startswith("net."):
            raise NetError(f"{key}: only per-namespace net.* sysctls are set inside a kvmtune namespace")
        self.exec("sysctl", "-q", "-w", f"{key}={value}")

    def link_json(self, dev: str) -> dict[str, Any]:
        res = self.ip("-d", "-j", "link", "show", "dev", dev)
        try:
            data = json.loads(res.stdout)
            return dict(data[0])
        except (ValueError, IndexError, TypeError):
            raise NetError(f"{self.name}: cannot read link {dev}") from None

    def links(self) -> list[str]:
        res = self.ip("-j", "link", "show")
        try:
            return [str(link["ifname"]) for link in json.loads(res.stdout)]
        except (ValueError, TypeError, KeyError):
            return []

    def set_mtu(self, dev: str, mtu: int) -> None:
        """Set ``dev``'s MTU; a refusal becomes one line naming the device and its maximum."""
        res = self.ip("link", "set", "dev", dev, "mtu", str(mtu), check=False)
        if res.ok:
            return
        detail = self.link_json(dev) if "greater than" in res.stderr or "Invalid argument" in res.stderr else {}
        top = detail.get("max_mtu")
        kind = (detail.get("linkinfo") or {}).get("info_kind", "device")
        if top is not None and mtu > int(top):
            raise NetError(f"MTU {mtu} is too large for {dev} ({kind}) in {self.name}: it allows at most {top}")
        raise NetError(f"{self.name}: cannot set MTU {mtu} on {dev}: {res.describe_failure()}")

    def mtu(self, dev: str) -> int:
        return int(self.link_json(dev)["mtu"])

    def add_address(self, dev: str, cidr: str) -> None:
        self.ip("addr", "add", check_address(cidr), "dev", dev)

    def up(self, dev: str) -> None:
        self.ip("link", "set", "dev", dev, "up")
