"""The canary's probe-guest metric: the time from QEMU's start to the probe guest's agent answering (a
``guest-sync-delimited`` round trip through the virtio-serial port), one boot a round.

It covers what a guest's start costs on this host: QEMU's own start, the accelerator, the kernel's boot, virtio. The
accelerator is what QEMU really ran (QMP ``query-kvm`` after the boot) and labels every figure (``accel`` in the cell):
a figure under TCG is emulation and is never compared with one under KVM (:mod:`kvmtune.canary.judge`). The guest is
the probe guest (:class:`kvmtune.lab.guest.GuestBuilder`, cached) with qemu-ga; its QEMU runs from a
``scratch-probe-<pid>`` directory in the work directory, stopped and removed every round, and dies with
kvmtune (the runner's parent-death signal); the next run's sweep removes a killed run's directory."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from kvmtune.errors import KvmtuneError
from kvmtune.guestagent.client import AgentError, Deadline, SocketAgent
from kvmtune.host.root import HostRoot
from kvmtune.lab.accel import AccelChoice, detect_accel
from kvmtune.lab.guest import GuestBuilder, ProbeGuest, guest_agent_file, guest_agent_job
from kvmtune.lab.qemu import QEMU, GuestRun, VmSpec
from kvmtune.lab.workdir import Scratch
from kvmtune.runner import Runner

BOOT_TIMEOUT_S = 60.0
MEMORY_MB = 512  # the initramfs with qemu-ga does not unpack in 256
SUN_PATH_MAX = 108  # a unix socket's path, with its terminating NUL
JOB = guest_agent_job() + "echo KVMTUNE-PROBE-READY\nwhile true; do sleep 3600; done\n"


@dataclass(frozen=True)
class Boot:
    seconds: float  # QEMU's start to the agent's first answer
    accel: str  # what QEMU ran: kvm | tcg (QMP query-kvm)


def probe_guest(runner: Runner, host: HostRoot, workdir: Path) -> tuple[ProbeGuest, AccelChoice]:
    """The probe guest with qemu-ga (built once, then cached) and the accelerator it gets here (``kvmtune guest
    accel``'s verdict: KVM only where a probe guest really boots under it; cached a day)."""
    if runner.which(QEMU) is None:
        raise KvmtuneError(f"{QEMU} not found: the canary's probe-guest metric needs QEMU")
    guest = GuestBuilder(workdir, runner, host, extra=(guest_agent_file(),)).build()
    return guest, detect_accel(guest, workdir, runner, host)


def boot_to_agent(guest: ProbeGuest, accel: str, workdir: Path, runner: Runner,
                  timeout: float = BOOT_TIMEOUT_S) -> Boot:
    """Boot the probe guest once under ``accel``; the seconds until its agent answers, and what QEMU really ran."""
    scratch = Scratch(workdir / f"scratch-probe-{os.getpid()}", runner)
    try:
        sock = scratch.add_file(scratch.path("qga.sock"))
        longest = scratch.path("probe.qmp")
        if len(os.fsencode(longest)) >= SUN_PATH_MAX:
            raise KvmtuneError(f"{workdir}: too long a path for the probe guest's sockets ({longest} is over "
                               f"{SUN_PATH_MAX - 1} bytes); pass a shorter --workdir")
        spec = VmSpec(guest=guest, accel=accel, memory_mb=MEMORY_MB, job=JOB, agent_socket=sock)
        with GuestRun(spec, scratch.root, runner, name="probe") as vm:
            started = time.monotonic()
            proc = vm.start()
            deadline = started + timeout
            agent: SocketAgent | None = None
            while agent is None:
                if proc.poll() is not None:
                    raise KvmtuneError(f"the canary's probe guest: QEMU exited {proc.returncode}: {_tail(vm)}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise KvmtuneError(f"the canary's probe guest: its agent did not answer within {timeout:.0f}s")
                if not sock.exists():
                    time.sleep(0.02)
                    continue
                try:
                    agent = SocketAgent(str(sock), Deadline(min(left, 5.0)))
                except AgentError:
                    continue
            took = time.monotonic() - started
            agent.close()
            ran = vm.query_accel()
            if ran is None:
                raise KvmtuneError("the canary's probe guest: QMP did not say which accelerator QEMU ran")
            return Boot(took, ran)
    finally:
        scratch.cleanup()
        scratch.remove_if_empty()


def _tail(vm: GuestRun) -> str:
    try:
        lines = vm.stderr_path.read_bytes()[-2000:].decode("utf-8", "replace").strip().splitlines()
    except OSError:
        lines = []
    return lines[-1][:160] if lines else "no error output"
