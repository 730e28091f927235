"""Launch the probe guest under QEMU and follow its serial console.

:func:`qemu_argv` is the one place the probe guest's virtual hardware (:class:`VmSpec`: its machine, its
:class:`Disk` s on their buses and controllers, its :class:`Nic` s, its agent channel) becomes QEMU options,
every value through :mod:`kvmtune.qemuopts`: the storage and net guest tiers, ``kvmtune guest run`` and the
probe-guest pair (:mod:`kvmtune.lab.probe.pair`) describe hardware, never option strings.

The guest prints ``KVMTUNE-…`` marker lines on ttyS0; QEMU writes the serial
port to a file that :class:`GuestRun` polls, calling ``on_line`` for every
new line so callers can sample host counters at the moments the guest
announces. QMP (plain JSON over a unix socket, no extra dependency) is used
to ask which accelerator is really active and to quit politely.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvmtune.errors import KvmtuneError
from kvmtune.lab.guest import GUEST_AGENT_PORT, ProbeGuest
from kvmtune.lab.workdir import stop_process
from kvmtune.qemu.qmp import Qmp
from kvmtune.qemuopts import Aio, Cache, ImageFormat, keyval, member, unix_socket, word
from kvmtune.runner import Runner

QEMU = "qemu-system-x86_64"
# Kernel arguments that shorten a TCG boot without changing the storage path under test.
FAST_BOOT_ARGS = "console=ttyS0 quiet panic=-1 tsc=reliable no_timer_check mitigations=off i8042.noaux i8042.nokbd"

# The guest device name for the first disk on each bus, and the modules that bring it up.
BUS_GUEST_DEV = {"virtio-blk": "vda", "virtio-scsi": "sda", "ide": "sda", "nvme": "nvme0n1"}
BUS_MODULES = {
    "virtio-blk": ("virtio_pci", "virtio_blk"),
    "virtio-scsi": ("virtio_pci", "virtio_scsi", "sd_mod"),
    "ide": ("ata_piix", "sd_mod"),
    "nvme": ("nvme",),
}


SERIAL = "kvmtune0"  # every probe-guest disk's serial: the guest finds its disk under test by it
IOTHREAD_ID = "kvmtune-io0"
MEM_ID = "kvmtune-mem"


@dataclass(frozen=True)
class Disk:
    """One disk of the probe guest.

    ``bus``: ``virtio-blk``, ``virtio-scsi`` (a ``virtio-scsi-pci`` controller), ``scsi`` (on ``controller``, QEMU's
    HBA device), ``ide``, ``sata`` (an ``ahci`` controller) or ``nvme``; ``cache``/``aio``/``fmt``: words of
    :mod:`kvmtune.qemuopts`' enumerations. ``iothread``: the disk's (virtio-blk) or its controller's (scsi) IOThread;
    ``queues``/``queue_size``: virtio-blk ``num-queues``/``queue-size``, a scsi controller's ``num_queues``.
    ``drive_id``/``device_id``/``controller_id``: the ids QMP sees (default ``d<index>``, none, ``scsi0``/``ahci0``).
    """

    path: str
    fmt: str
    bus: str
    cache: str
    aio: str
    controller: str | None = None
    iothread: bool = False
    queues: int | None = None
    queue_size: int | None = None
    drive_id: str | None = None
    device_id: str | None = None
    controller_id: str | None = None


@dataclass(frozen=True)
class Nic:
    """One NIC of the probe guest: ``model`` (QEMU's device) on the ``-netdev`` with id ``netdev_id``; ``netdev``:
    that ``-netdev``'s value when the NIC brings it (:func:`tap_netdev`, or a topology's endpoint), None when
    another option defines it. ``queues`` > 1: multiqueue virtio-net; ``host_mtu`` and ring sizes: virtio-net's."""

    netdev_id: str
    netdev: str | None = None
    model: str = "virtio-net-pci"
    mac: str | None = None
    device_id: str | None = None
    host_mtu: int | None = None
    queues: int = 1
    rx_queue_size: int | None = None
    tx_queue_size: int | None = None


@dataclass(frozen=True)
class Machine:
    """The machine of a probe guest that is not the launcher's plain ``pc``: its type, vCPU topology (sockets,
    cores, threads) and memory backed by hugepages mounted at ``hugetlbfs`` (``VmSpec.memory_mb`` of them)."""

    type: str = "pc"
    topology: tuple[int, ...] | None = None
    hugetlbfs: str | None = None


@dataclass
class VmSpec:
    guest: ProbeGuest
    accel: str
    memory_mb: int = 512
    smp: int = 1
    disks: Sequence[Disk] = ()
    job: str | None = None
    extra_append: str = ""
    # plumbing from outside the VM: extra QEMU arguments (a -netdev a namespace's tap stands behind), a command
    # prefix (``ip netns exec NS``: QEMU must open its tap inside a namespace) and fds QEMU inherits (macvtap's
    # /dev/tapN passed as ``-netdev tap,fd=N``)
    extra_args: Sequence[str] = ()
    wrapper: Sequence[str] = ()
    pass_fds: Sequence[int] = ()
    # restore a saved, already booted guest instead of booting (see bench/snapshot.py)
    incoming: Path | None = None
    machine: Machine | None = None
    nics: Sequence[Nic] = ()
    agent_socket: Path | None = None  # the guest agent's channel: a socket QEMU listens on


def tap_netdev(netdev_id: str, ifname: str, vhost: bool, queues: int = 1) -> str:
    """A ``-netdev`` on the tap ``ifname`` (made beforehand: no script), vhost-net on or off, its queue pairs."""
    return keyval(("id", netdev_id), ("ifname", ifname), ("script", "no"), ("downscript", "no"),
                  ("vhost", vhost), ("queues", queues if queues > 1 else None), first="tap")


def _machine_argv(m: Machine, spec: VmSpec) -> list[str]:
    # the launcher wrote -machine pc and -smp N first: QEMU merges repeated -machine/-smp, the later wins
    topology = dict(zip(("sockets", "cores", "threads"), m.topology or (), strict=False))
    argv = ["-machine", word("-machine", m.type), "-smp", keyval(*topology.items(), first=str(int(spec.smp)))]
    if m.hugetlbfs is not None:
        argv += ["-object", keyval(("id", MEM_ID), ("size", f"{int(spec.memory_mb)}M"), ("mem-path", Path(m.hugetlbfs)),
                                   ("share", False), ("prealloc", True), first="memory-backend-file"),
                 "-machine", keyval(("memory-backend", MEM_ID))]
    return argv


def _disk_argv(i: int, d: Disk) -> list[str]:
    drive = d.drive_id or f"d{i}"
    argv = ["-drive", keyval(("file", Path(d.path)), ("format", member("format", ImageFormat, d.fmt)), ("if", "none"),
                             ("id", drive), ("cache", member("cache", Cache, d.cache)), ("aio", member("aio", Aio, d.aio)))]
    thread = ("iothread", IOTHREAD_ID if d.iothread else None)
    if d.iothread:
        argv += ["-object", keyval(("id", IOTHREAD_ID), first="iothread")]
    disk = (("drive", drive), ("id", d.device_id))
    match d.bus:
        case "virtio-blk":
            return [*argv, "-device", keyval(*disk, ("serial", SERIAL), thread, ("num-queues", d.queues),
                                             ("queue-size", d.queue_size), first="virtio-blk-pci")]
        case "virtio-scsi" | "scsi":
            ctl = d.controller_id or "scsi0"
            hba = "virtio-scsi-pci" if d.bus == "virtio-scsi" else word("SCSI controller", d.controller or "")
            return [*argv, "-device", keyval(("id", ctl), thread, ("num_queues", d.queues), first=hba),
                    "-device", keyval(*disk, ("bus", ctl + ".0"), ("serial", SERIAL), first="scsi-hd")]
        case "ide":
            return [*argv, "-device", keyval(*disk, ("bus", "ide.0"), ("serial", SERIAL), first="ide-hd")]
        case "sata":
            ctl = d.controller_id or "ahci0"
            return [*argv, "-device", keyval(("id", ctl), first="ahci"),
                    "-device", keyval(*disk, ("bus", ctl + ".0"), ("serial", SERIAL), first="ide-hd")]
        case "nvme":
            return [*argv, "-device", keyval(*disk, ("serial", SERIAL), first="nvme")]
    raise KvmtuneError(f"the probe guest has no {d.bus!r} disk bus")


def _nic_argv(n: Nic) -> list[str]:
    argv = ["-netdev", n.netdev] if n.netdev is not None else []
    virtio = n.model.startswith("virtio-net")
    multi = virtio and n.queues > 1
    return [*argv, "-device", keyval(
        ("netdev", n.netdev_id), ("id", n.device_id), ("mac", n.mac), ("host_mtu", n.host_mtu if virtio else None),
        ("mq", True if multi else None), ("vectors", 2 * n.queues + 2 if multi else None),
        ("rx_queue_size", n.rx_queue_size if virtio else None), ("tx_queue_size", n.tx_queue_size if virtio else None),
        first=word("NIC model", n.model))]


def agent_argv(sock: Path) -> list[str]:
    """The guest agent's channel: a virtio-serial port behind a socket QEMU listens on (part of :func:`qemu_argv`)."""
    return [
        "-chardev", keyval(("path", sock), ("server", True), ("wait", False), ("id", "qga0"), first="socket"),
        "-device", keyval(("id", "vser0"), first="virtio-serial-pci"),
        "-device", keyval(("bus", "vser0.0"), ("chardev", "qga0"), ("name", GUEST_AGENT_PORT), first="virtserialport"),
    ]


def qemu_argv(spec: VmSpec, serial: Path, qmp: Path, job_file: Path | None, qemu: str = QEMU) -> list[str]:
    """The whole QEMU command line of one probe guest: the launcher's machine, console, QMP and boot, then
    ``spec.extra_args`` (plumbing from outside the VM), then the virtual hardware :class:`VmSpec` describes."""
    accel = {"kvm": "kvm", "tcg": "tcg,thread=single" if spec.smp == 1 else "tcg"}[spec.accel]
    argv = [
        qemu,
        "-machine",
        "pc",
        "-accel",
        accel,
        "-m",
        str(spec.memory_mb),
        "-smp",
        str(spec.smp),
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
        "-serial",
        f"file:{serial}",
        "-qmp",
        keyval(("server", True), ("wait", False), first=unix_socket(qmp)),
        "-kernel",
        str(spec.guest.vmlinux or spec.guest.kernel),
        "-initrd",
        str(spec.guest.initrd),
        "-append",
        (FAST_BOOT_ARGS + " " + spec.extra_append).strip(),
    ]
    if spec.accel == "kvm":
        argv += ["-cpu", "host"]
    if job_file is not None:
        argv += ["-fw_cfg", keyval(("name", "opt/kvmtune/job"), ("file", job_file))]
    argv += list(spec.extra_args)
    if spec.machine is not None:
        argv += _machine_argv(spec.machine, spec)
    for i, d in enumerate(spec.disks):
        argv += _disk_argv(i, d)
    for n in spec.nics:
        argv += _nic_argv(n)
    if spec.agent_socket is not None:
        argv += agent_argv(spec.agent_socket)
    if spec.incoming is not None:
        argv += ["-incoming", "exec:cat " + shlex.quote(str(spec.incoming))]
    return argv


@dataclass
class RunOutcome:
    lines: list[str]
    exit_code: int | None
    timed_out: bool
    duration_s: float
    stderr_tail: str
    pid: int
    accel_confirmed: str | None = None
    line_times: list[float] = field(default_factory=list)
    restored: bool = False
    stopped: str | None = None  # the run state QMP reported when QEMU stopped the guest (STOPPED_STATES)

    def error(self) -> str | None:
        """One line describing why the guest run failed, or None."""
        if self.stopped:
            detail = kvm_error(self.stderr_tail)
            return f"QEMU stopped the guest in its {self.stopped} state" + (f": {detail}" if detail else "")
        if self.timed_out:
            last = next((ln for ln in reversed(self.lines) if ln.strip()), "no console output")
            if not self.restored and not any(ln.startswith("KVMTUNE-BOOTED") for ln in self.lines):
                return f"kernel did not boot within {self.duration_s:.0f}s (last console line: {last[:120]!r})"
            return f"guest did not finish within {self.duration_s:.0f}s (last console line: {last[:120]!r})"
        if self.exit_code not in (0, None):
            err = self.stderr_tail.strip().splitlines()
            return f"QEMU exited {self.exit_code}: {err[-1] if err else 'no error output'}"
        if not any(ln.startswith("KVMTUNE-POWEROFF") for ln in self.lines):
            if not self.restored and not any(ln.startswith("KVMTUNE-BOOTED") for ln in self.lines):
                panic = next((ln for ln in self.lines if "Kernel panic" in ln), None)
                return "kernel did not boot" + (f": {panic.strip()[:140]}" if panic else " (no init output)")
            return "guest stopped before its job finished"
        return None


# QEMU's run states (QMP query-status) in which a guest never goes on by itself: KVM refused to run it (a KVM
# internal error, e.g. an emulation failure) or its kernel panicked (with a pvpanic device)
STOPPED_STATES = ("internal-error", "guest-panicked")
# how often follow() asks QMP for the run state until the guest's init announces itself (KVMTUNE-BOOTED); not
# after: a booted guest's job is being measured, and its console's line times must not wait on QMP
STATUS_EVERY_S = 0.5


def kvm_error(stderr: str) -> str:
    """What QEMU printed when KVM stopped the guest, in one line: the error, its suberror's meaning, the
    instruction pointer and the instruction bytes QEMU dumps (``Code=… <0f> 01 …``: the byte at RIP in brackets)."""
    lines = [ln.strip() for ln in stderr.splitlines()]
    head = next((ln for ln in lines if ln.startswith(("KVM internal error", "error: kvm run failed"))), None)
    if head is None:
        return ""
    parts = [head.rstrip(".")]
    if "emulation failure" in lines:
        parts.append("emulation failure")
    rip = next((m.group(1) for ln in lines if (m := re.match(r"RIP=([0-9a-fA-F]+)", ln))), None)
    code = next((ln for ln in lines if ln.startswith("Code=")), None)
    if rip:
        parts.append(f"at RIP={rip}")
    if code and "<" in code:
        at = code.index("<")
        parts.append("instruction bytes " + " ".join(code[at:].split()[:6]))
    return ", ".join(parts)


class GuestRun:
    """One QEMU process running the probe guest; use as a context manager."""

    def __init__(self, spec: VmSpec, rundir: Path, runner: Runner, name: str = "vm") -> None:
        self.spec = spec
        self.runner = runner
        self.rundir = rundir
        rundir.mkdir(parents=True, exist_ok=True)
        self.serial = rundir / f"{name}.serial"
        self.qmp_path = rundir / f"{name}.qmp"
        self.stderr_path = rundir / f"{name}.stderr"
        self.job_path = rundir / f"{name}.job.sh" if spec.job is not None else None
        self.proc: subprocess.Popen[bytes] | None = None
        self._stderr_fh: Any = None
        self._created = [self.serial, self.qmp_path, self.stderr_path] + ([self.job_path] if self.job_path else [])

    def __enter__(self) -> GuestRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> subprocess.Popen[bytes]:
        for p in (self.serial, self.qmp_path):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        if self.job_path is not None and self.spec.job is not None:
            self.job_path.write_text(self.spec.job)
        self.serial.write_bytes(b"")
        argv = [*self.spec.wrapper, *qemu_argv(self.spec, self.serial, self.qmp_path, self.job_path)]
        self._stderr_fh = open(self.stderr_path, "wb")  # noqa: SIM115 - closed in close()
        self.proc = self.runner.popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr_fh,
            start_new_session=True,
            pass_fds=tuple(self.spec.pass_fds),
        )
        if self.spec.incoming is not None:
            self._resume_incoming()
        return self.proc

    def _resume_incoming(self, timeout: float = 60.0) -> None:
        """Wait for the saved state to load, then let the guest run (it was saved paused)."""
        assert self.proc is not None
        try:
            q = Qmp(self.qmp_path, timeout=10.0)
        except OSError as exc:
            raise KvmtuneError(f"QMP of the restoring guest: {exc}") from None
        try:
            deadline = time.monotonic() + timeout
            while True:
                status = (q.execute("query-status") or {}).get("status")
                if status != "inmigrate":
                    break
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise KvmtuneError("restoring the saved probe guest failed")
                time.sleep(0.01)
            if status != "running":
                q.execute("cont")
        except (OSError, ValueError) as exc:
            raise KvmtuneError(f"restoring the saved probe guest: {exc}") from None
        finally:
            q.close()

    def save_state(self, path: Path, timeout: float = 120.0) -> None:
        """Pause the guest and write its whole state to ``path`` (atomically), then stop QEMU."""
        part = path.with_name(path.name + f".part{os.getpid()}")
        q = Qmp(self.qmp_path, timeout=10.0)
        try:
            q.execute("stop")
            q.execute("migrate", uri="exec:cat > " + shlex.quote(str(part)))
            deadline = time.monotonic() + timeout
            while True:
                info = q.execute("query-migrate") or {}
                status = info.get("status")
                if status == "completed":
                    break
                if status in ("failed", "cancelled") or time.monotonic() > deadline:
                    raise KvmtuneError(f"saving the probe guest failed ({info.get('error-desc', status)})")
                time.sleep(0.02)
            q.execute("quit")
        except BaseException:
            part.unlink(missing_ok=True)  # Ctrl-C or failure half-way: no partial state left
            raise
        finally:
            q.close()
        part.replace(path)

    def query_accel(self) -> str | None:
        """Ask QEMU over QMP whether KVM is really enabled."""
        try:
            q = Qmp(self.qmp_path, timeout=3.0)
        except OSError:
            return None
        try:
            kvm = q.execute("query-kvm")
            return "kvm" if kvm and kvm.get("enabled") else "tcg"
        except (OSError, KvmtuneError, ValueError):
            return None
        finally:
            q.close()

    def query_status(self) -> str | None:
        """QEMU's run state over QMP (running, paused, internal-error, guest-panicked, …); None: no answer."""
        if not self.qmp_path.exists():
            return None
        try:
            q = Qmp(self.qmp_path, timeout=1.0)
        except OSError:
            return None
        try:
            status = q.execute("query-status")
            return str(status["status"]) if isinstance(status, dict) and "status" in status else None
        except (OSError, KvmtuneError, ValueError):
            return None
        finally:
            q.close()

    def follow(
        self,
        timeout: float,
        on_line: Callable[[str, float], None] | None = None,
        poll: float = 0.02,
        boot_timeout: float | None = None,
    ) -> RunOutcome:
        """Poll the console until QEMU exits or ``timeout`` seconds pass (then kill it).

        With ``boot_timeout``, a guest whose init has not announced itself by then is
        killed early: a kernel that does not boot should not cost the whole budget. Until then, a guest
        that QEMU stopped (QMP's run state internal-error or guest-panicked: it will never go on) is killed
        at once, the state kept in :attr:`RunOutcome.stopped`.
        """
        if self.proc is None:
            self.start()
        assert self.proc is not None
        start = time.monotonic()
        lines: list[str] = []
        times: list[float] = []
        pending = b""
        pos = 0
        accel: str | None = None
        timed_out = False
        stopped: str | None = None
        booted = self.spec.incoming is not None  # a restored guest booted long ago
        next_status = start + STATUS_EVERY_S
        with open(self.serial, "rb") as fh:
            while True:
                fh.seek(pos)
                chunk = fh.read()
                if chunk:
                    pos += len(chunk)
                    pending += chunk
                    *complete, pending = pending.split(b"\n")
                    now = time.monotonic()
                    for raw in complete:
                        line = raw.decode("utf-8", "replace").rstrip("\r")
                        lines.append(line)
                        times.append(now - start)
                        if on_line is not None:
                            on_line(line, now)
                        if accel is None and line.startswith("KVMTUNE-BOOTED"):
                            booted = True
                            accel = self.query_accel()
                if self.proc.poll() is not None:
                    rest = fh.read()
                    if rest or pending:
                        for raw in (pending + rest).split(b"\n"):
                            if raw:
                                line = raw.decode("utf-8", "replace").rstrip("\r")
                                lines.append(line)
                                times.append(time.monotonic() - start)
                                if on_line is not None:
                                    on_line(line, time.monotonic())
                    break
                now = time.monotonic()
                if not booted and now >= next_status:
                    next_status = now + STATUS_EVERY_S
                    state = self.query_status()
                    if state in STOPPED_STATES:
                        stopped = state
                        time.sleep(0.1)  # QEMU writes its register dump to stderr as it stops
                        stop_process(self.proc, grace=1.0)
                        break
                elapsed = time.monotonic() - start
                if elapsed > timeout or (boot_timeout is not None and not booted and elapsed > boot_timeout):
                    timed_out = True
                    stop_process(self.proc, grace=1.0)
                    break
                time.sleep(poll)
        duration = time.monotonic() - start
        code = self.proc.returncode
        if self._stderr_fh is not None:
            self._stderr_fh.close()
            self._stderr_fh = None
        try:
            tail = self.stderr_path.read_bytes()[-2000:].decode("utf-8", "replace")
        except OSError:
            tail = ""
        return RunOutcome(lines, code, timed_out, duration, tail, self.proc.pid, accel, times,
                          restored=self.spec.incoming is not None, stopped=stopped)

    def close(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, grace=1.0)
        if self._stderr_fh is not None:
            self._stderr_fh.close()
            self._stderr_fh = None
        if not os.environ.get("KVMTUNE_KEEP_CONSOLE"):
            for p in self._created:
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
            with contextlib.suppress(OSError):
                self.rundir.rmdir()  # only when empty: a concurrent run may share it


def qemu_version(runner: Runner, qemu: str = QEMU) -> str:
    res = runner.run([qemu, "--version"], timeout=20)
    if not res.ok:
        raise KvmtuneError(f"{qemu}: not usable ({res.describe_failure()}); install qemu-system-x86")
    first = res.stdout.splitlines()[0] if res.stdout else ""
    return first.replace("QEMU emulator version ", "").strip()
