"""Launch the probe guest under QEMU and follow its serial console.

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
from kvmtune.lab.guest import ProbeGuest
from kvmtune.lab.workdir import stop_process
from kvmtune.qemu.qmp import Qmp
from kvmtune.qemuopts import Aio, Cache, ImageFormat, keyval, member, unix_socket
from kvmtune.runner import Runner

QEMU = "qemu-system-x86_64"
# Kernel arguments that shorten a TCG boot without changing the storage path under test.
FAST_BOOT_ARGS = "console=ttyS0 quiet panic=-1 tsc=reliable no_timer_check mitigations=off i8042.noaux i8042.nokbd"

BUS_DEVICE = {
    "virtio-blk": ["-device", "virtio-blk-pci,drive={drive},serial=kvmtune0"],
    "virtio-scsi": ["-device", "virtio-scsi-pci,id=scsi0", "-device", "scsi-hd,drive={drive},bus=scsi0.0,serial=kvmtune0"],
    "ide": ["-device", "ide-hd,drive={drive},bus=ide.0,serial=kvmtune0"],
    "nvme": ["-device", "nvme,drive={drive},serial=kvmtune0"],
}
# The guest device name for the first disk on each bus, and the modules that bring it up.
BUS_GUEST_DEV = {"virtio-blk": "vda", "virtio-scsi": "sda", "ide": "sda", "nvme": "nvme0n1"}
BUS_MODULES = {
    "virtio-blk": ("virtio_pci", "virtio_blk"),
    "virtio-scsi": ("virtio_pci", "virtio_scsi", "sd_mod"),
    "ide": ("ata_piix", "sd_mod"),
    "nvme": ("nvme",),
}


@dataclass(frozen=True)
class Disk:
    path: str
    fmt: str
    bus: str
    cache: str
    aio: str


@dataclass
class VmSpec:
    guest: ProbeGuest
    accel: str
    memory_mb: int = 512
    smp: int = 1
    disks: Sequence[Disk] = ()
    job: str | None = None
    extra_append: str = ""
    # network benchmarks: extra QEMU arguments (-netdev/-device), a command prefix
    # (``ip netns exec NS``: QEMU must open its tap inside a namespace) and fds
    # QEMU inherits (macvtap's /dev/tapN passed as ``-netdev tap,fd=N``)
    extra_args: Sequence[str] = ()
    wrapper: Sequence[str] = ()
    pass_fds: Sequence[int] = ()
    # restore a saved, already booted guest instead of booting (see bench/snapshot.py)
    incoming: Path | None = None


def qemu_argv(spec: VmSpec, serial: Path, qmp: Path, job_file: Path | None, qemu: str = QEMU) -> list[str]:
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
    for i, d in enumerate(spec.disks):
        drive = f"d{i}"
        opts = keyval(("file", Path(d.path)), ("format", member("format", ImageFormat, d.fmt)), ("if", "none"),
                      ("id", drive), ("cache", member("cache", Cache, d.cache)), ("aio", member("aio", Aio, d.aio)))
        argv += ["-drive", opts]
        argv += [a.replace("{drive}", drive) for a in BUS_DEVICE[d.bus]]
    argv += list(spec.extra_args)
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
