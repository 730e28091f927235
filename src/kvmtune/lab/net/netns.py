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

:class:`HeldNetns` is the other kind (the guest tier's): a namespace with no name in ``/run/netns``,
held by a keeper process kvmtune starts (``unshare --net``, dying with kvmtune like every child of
the :class:`~kvmtune.runner.Runner`). Commands enter it with ``nsenter --net=/proc/<keeper>/ns/net``;
when the keeper and everything inside are gone, even after SIGKILL of kvmtune, the kernel removes the
namespace and its devices, so there is nothing to find or sweep.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import re
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import PurePath
from typing import Any

from kvmtune.errors import KvmtuneError
from kvmtune.host.root import HostRoot
from kvmtune.qemuopts import long_option
from kvmtune.runner import CommandResult, Runner

PREFIX = "kvmtune-"
ADDRESS_SPACE = ipaddress.ip_network("198.18.0.0/15")
NETNS_DIR = "/run/netns"
MIN_MTU, MAX_MTU = 68, 65535
CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21
KEEPER_START_S = 10.0  # the keeper's unshare(CLONE_NEWNET) is done long before this
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

    def pids(self) -> list[int]:
        """The processes inside the namespace."""
        return namespace_pids(self.runner, self.name)

    def remove(self) -> list[str]:
        """Delete the namespace; the problems (empty: gone). Its processes must have been stopped."""
        res = self.delete()
        if not res.ok and "No such file" not in res.stderr:
            return [f"{self.name}: {res.describe_failure()}"]
        return []

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


def _exited(proc: subprocess.Popen[bytes]) -> bool:
    """True when ``proc`` has exited, without reaping it: its pid stays ours (a zombie) until it is waited for."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped already
        return True


@dataclass
class HeldNetns(Netns):
    """A namespace held by a keeper process instead of a name in ``/run/netns`` (the guest tier's).

    The keeper (``unshare --net -- sleep infinity``) is started through the Runner, so the kernel kills it when
    kvmtune dies, SIGKILL included; so are the processes started inside (``nsenter``, then QEMU or netload, which
    exec in place). With the last of them gone the kernel removes the namespace with its bridge and taps: a
    killed run leaves none. ``name`` only labels it (messages, the run's facts).

    Every command enters it by ``/proc/<keeper>/ns/net`` of the keeper this object started and still holds: the
    keeper is never reaped before :meth:`remove` (checks use ``waitid(WNOWAIT)``), so its pid cannot be reused
    meanwhile, and a dead keeper (a zombie has no namespace link) makes ``nsenter`` fail rather than enter
    another namespace.
    """

    host: HostRoot = field(default_factory=HostRoot)
    _keeper: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _link: str | None = field(default=None, repr=False)  # net:[inode] of the namespace

    def create(self) -> None:
        for tool in ("unshare", "nsenter"):
            if self.runner.which(tool) is None:
                raise NetError(f"{tool} (util-linux) is not installed: the guest tier's namespace needs it")
        own = self.host.readlink("/proc/self/ns/net")
        if own is None:
            raise NetError("cannot read this process's network namespace (/proc/self/ns/net)")
        keeper = self.runner.popen(["unshare", "--net", "--", "sleep", "infinity"], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        self._keeper = keeper
        deadline = time.monotonic() + KEEPER_START_S
        while True:  # until the keeper's unshare(2) is done: before it, its namespace is still ours
            link = self.host.readlink(f"/proc/{keeper.pid}/ns/net")
            if _exited(keeper):
                err = keeper.stderr.read().decode(errors="replace").strip() if keeper.stderr else ""
                last = err.splitlines()[-1] if err else "no error output"
                raise NetError(f"cannot create network namespace {self.name}: 'unshare --net' exited: {last}")
            if link is not None and link != own:
                break
            if time.monotonic() > deadline:
                raise NetError(f"cannot create network namespace {self.name}: 'unshare --net' did not enter a new one "
                               f"within {KEEPER_START_S:.0f}s")
            time.sleep(0.005)
        self._link = link
        self.ip("link", "set", "lo", "up")

    @property
    def keeper_pid(self) -> int | None:
        return self._keeper.pid if self._keeper is not None else None

    @property
    def path(self) -> str:
        """``/proc/<keeper>/ns/net``; :class:`NetError` once the keeper is gone."""
        if self._keeper is None or _exited(self._keeper):
            raise NetError(f"{self.name}: the process holding the namespace is gone (and the namespace with it)")
        return f"/proc/{self._keeper.pid}/ns/net"

    @property
    def exec_prefix(self) -> list[str]:
        return ["nsenter", long_option("net", PurePath(self.path)), "--"]

    def ip(self, *args: str, check: bool = True, timeout: float = 30) -> CommandResult:
        res = self.runner.run([*self.exec_prefix, "ip", *args], timeout=timeout)
        if check and not res.ok:
            raise NetError(f"{self.name}: {replace(res, argv=('ip', *args)).describe_failure()}")
        return res

    def pids(self) -> list[int]:
        """The processes inside the namespace, the keeper excepted."""
        if self._link is None:
            return []
        out = []
        for entry in self.host.listdir("/proc"):
            if entry.isdigit() and int(entry) != self.keeper_pid and self.host.readlink(f"/proc/{entry}/ns/net") == self._link:
                out.append(int(entry))
        return out

    def delete(self) -> CommandResult:
        problems = self.remove()
        return CommandResult(("kill", "keeper"), 1 if problems else 0, "", "; ".join(problems), 0.0)

    def remove(self) -> list[str]:
        """Stop the keeper; the problems (empty: no process holds the namespace any more, so the kernel removes it)."""
        keeper, self._keeper = self._keeper, None
        if keeper is None:
            return []
        keeper.kill()  # reaped below: only now may its pid be reused
        try:
            keeper.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return [f"{self.name}: the keeper process {keeper.pid} survived SIGKILL"]
        finally:
            if keeper.stderr is not None:
                keeper.stderr.close()
        held = self.pids()
        return [f"{self.name}: still held by pid {', '.join(map(str, held))}"] if held else []
