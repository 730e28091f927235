"""A private Open vSwitch instance inside one kvmtune namespace.

kvmtune never talks to the host's own OVS: it creates a database from the
installed schema in its run directory, starts ``ovsdb-server`` and
``ovs-vswitchd`` inside the namespace (as direct children, with pidfiles,
logs, control sockets and the database socket all in that directory, and
``OVS_RUNDIR``/``OVS_DBDIR``/… pointed there too), and stops them on
teardown. The kernel datapath is used only when the ``openvswitch`` module is
already loaded; otherwise the userspace datapath (``datapath_type=netdev``).
The choice is recorded in the topology's facts.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvmtune.host.root import HostRoot
from kvmtune.lab.net.netns import NetError, Netns
from kvmtune.lab.workdir import stop_process
from kvmtune.runner import Runner

SCHEMA_CANDIDATES = ("/usr/share/openvswitch/vswitch.ovsschema", "/usr/local/share/openvswitch/vswitch.ovsschema")
TOOLS = ("ovsdb-tool", "ovsdb-server", "ovs-vswitchd", "ovs-vsctl")
SOCKET_PATH_MAX = 100  # sun_path is 108 bytes


def ovs_available(runner: Runner, host: HostRoot) -> str | None:
    """None when OVS can run here, else why not (one line)."""
    missing = [t for t in TOOLS if runner.which(t) is None]
    if missing:
        return f"Open vSwitch unavailable: {', '.join(missing)} not installed (Debian package openvswitch-switch)"
    if not any(host.exists(p) for p in SCHEMA_CANDIDATES):
        return f"Open vSwitch unavailable: schema not found ({SCHEMA_CANDIDATES[0]})"
    return None


def pick_datapath(host: HostRoot, wanted: str) -> str:
    """``system`` (kernel module) or ``netdev`` (userspace) for ``wanted`` in auto|system|netdev."""
    loaded = host.exists("/sys/module/openvswitch")
    if wanted == "auto":
        return "system" if loaded else "netdev"
    if wanted == "system" and not loaded:
        raise NetError("Open vSwitch kernel datapath unavailable (openvswitch module not loaded); use --ovs-datapath netdev")
    if wanted not in ("system", "netdev"):
        raise NetError(f"unknown OVS datapath {wanted!r} (choose auto, system or netdev)")
    return wanted


@dataclass
class OvsInstance:
    ns: Netns
    directory: Path
    runner: Runner
    host: HostRoot
    datapath: str = "netdev"
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def db_socket(self) -> Path:
        return self.directory / "db.sock"

    def _env(self) -> dict[str, str]:
        d = str(self.directory)
        return {"OVS_RUNDIR": d, "OVS_DBDIR": d, "OVS_LOGDIR": d, "OVS_SYSCONFDIR": d}

    def _schema(self) -> str:
        for p in SCHEMA_CANDIDATES:
            if self.host.exists(p):
                return p
        raise NetError(f"Open vSwitch unavailable: schema not found ({SCHEMA_CANDIDATES[0]})")

    def _log_tail(self, name: str) -> str:
        try:
            lines = (self.directory / f"{name}.log").read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        errs = [ln for ln in lines if "|ERR|" in ln or "|EMER|" in ln] or lines
        return errs[-1].split("|")[-1].strip() if errs else "empty log"

    def _start(self, name: str, argv: list[str], ready: Path) -> None:
        with open(self.directory / f"{name}.stderr", "wb") as err:
            proc = self.runner.popen(
                [*self.ns.exec_prefix, *argv],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=self._merged_env(),
                start_new_session=True,
            )
        self.procs.append(proc)
        deadline = time.monotonic() + 15
        while not ready.exists():
            if proc.poll() is not None:
                raise NetError(f"{name} exited {proc.returncode} in {self.ns.name}: {self._log_tail(name)}")
            if time.monotonic() > deadline:
                raise NetError(f"{name} did not become ready within 15s in {self.ns.name}: {self._log_tail(name)}")
            time.sleep(0.02)

    def _merged_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self._env())
        return env

    def vsctl(self, *args: str) -> str:
        res = self.runner.run(["ovs-vsctl", f"--db=unix:{self.db_socket}", "--timeout=20", *args], timeout=30, env=self._env())
        if not res.ok:
            raise NetError(f"ovs-vsctl in {self.ns.name}: {res.describe_failure()}")
        return res.stdout

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        if len(str(self.db_socket)) > SOCKET_PATH_MAX:
            raise NetError(f"{self.directory}: path too long for OVS's unix sockets; use a shorter --workdir")
        d = self.directory
        db = d / "conf.db"
        res = self.runner.run(["ovsdb-tool", "create", str(db), self._schema()], timeout=30, env=self._env())
        if not res.ok:
            raise NetError(f"ovsdb-tool create: {res.describe_failure()}")
        self._start(
            "ovsdb-server",
            [
                "ovsdb-server",
                str(db),
                f"--remote=punix:{self.db_socket}",
                f"--pidfile={d / 'ovsdb-server.pid'}",
                f"--unixctl={d / 'ovsdb-server.ctl'}",
                f"--log-file={d / 'ovsdb-server.log'}",
                "-vconsole:off",
            ],
            self.db_socket,
        )
        init = ["init"]
        if self.datapath == "netdev":
            # QEMU's taps carry checksum/segmentation offload metadata (virtio-net headers); the userspace
            # datapath keeps it only with userspace TSO on, otherwise guests' TCP segments arrive with
            # unfilled checksums and only ping works
            init += ["--", "set", "Open_vSwitch", ".", "other_config:userspace-tso-enable=true"]
        res = self.runner.run(["ovs-vsctl", f"--db=unix:{self.db_socket}", "--no-wait", *init], timeout=30, env=self._env())
        if not res.ok:
            raise NetError(f"ovs-vsctl init: {res.describe_failure()}")
        self._start(
            "ovs-vswitchd",
            [
                "ovs-vswitchd",
                f"unix:{self.db_socket}",
                f"--pidfile={d / 'ovs-vswitchd.pid'}",
                f"--unixctl={d / 'ovs-vswitchd.ctl'}",
                f"--log-file={d / 'ovs-vswitchd.log'}",
                "-vconsole:off",
            ],
            d / "ovs-vswitchd.ctl",
        )

    def add_bridge(self, name: str, mtu: int) -> None:
        self.vsctl(
            "add-br",
            name,
            "--",
            "set",
            "bridge",
            name,
            f"datapath_type={self.datapath}",
            "--",
            "set",
            "interface",
            name,
            f"mtu_request={mtu}",
        )

    def add_port(self, bridge: str, port: str, mtu: int) -> None:
        self.vsctl("add-port", bridge, port, "--", "set", "interface", port, f"mtu_request={mtu}")

    def wait_mtu(self, dev: str, mtu: int, timeout: float = 10) -> None:
        """OVS applies ``mtu_request`` asynchronously; wait for it, or say which device refused."""
        deadline = time.monotonic() + timeout
        while True:
            current = self.ns.mtu(dev)
            if current == mtu:
                return
            if time.monotonic() > deadline:
                info = self.ns.link_json(dev)
                top = info.get("max_mtu")
                if top is not None and mtu > int(top):
                    raise NetError(f"MTU {mtu} is too large for {dev} (OVS port) in {self.ns.name}: it allows at most {top}")
                raise NetError(f"Open vSwitch did not set MTU {mtu} on {dev} in {self.ns.name} (it is {current})")
            time.sleep(0.05)

    def stop(self) -> list[str]:
        problems: list[str] = []
        for proc in reversed(self.procs):
            try:
                stop_process(proc, grace=3.0)
            except Exception as exc:  # teardown goes on
                problems.append(f"ovs pid {proc.pid}: {exc}")
        self.procs.clear()
        with contextlib.suppress(OSError):
            for p in self.directory.glob("*.pid"):
                p.unlink()
        return problems
