"""One way to drive a booted probe guest: its QEMU guest agent.

:class:`ProbeAgent` connects to the agent of one probe guest that :class:`~kvmtune.lab.qemu.GuestRun`
started with an agent channel (``VmSpec.agent_socket``) and a job that ends in
:func:`~kvmtune.lab.guest.guest_agent_job`. It runs a command through ``guest-exec`` and returns its exit
code and size-bounded output (:meth:`ProbeAgent.exec`), or starts one and leaves it running
(:meth:`ProbeAgent.spawn`: a server). The probe-guest pair (:mod:`kvmtune.lab.probe.pair`) and the net
guest tier (:mod:`kvmtune.bench.net.guest`) both use it; the console only tells what happens before the
agent answers (boot, a job's ``KVMTUNE-FATAL``, a panic).

What the guest prints is the guest's: every answer is size-bounded by the agent client, decoded with
replacement, and parsed strictly by the caller.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import time
from pathlib import Path
from typing import Any

from kvmtune.errors import KvmtuneError
from kvmtune.guestagent.client import PROBE_GUEST_COMMANDS, AgentError, Deadline, SocketAgent
from kvmtune.lab.probe.side import ExecResult
from kvmtune.lab.qemu import STATUS_EVERY_S, STOPPED_STATES, GuestRun, kvm_error

MAX_OUTPUT = 1 << 20  # bytes of a command's stdout or stderr kept (the agent client bounds its answers as well)


class ProbeAgent:
    """The agent of probe guest ``name``, run by ``run``, listening on ``socket`` (host side)."""

    def __init__(self, run: GuestRun, socket: Path, name: str) -> None:
        self.run = run
        self.socket = socket
        self.name = name
        self._agent: SocketAgent | None = None

    def alive(self) -> None:
        """Raise when the guest's QEMU has exited (its last error line in the message)."""
        proc = self.run.proc
        assert proc is not None
        if proc.poll() is not None:
            try:
                tail = self.run.stderr_path.read_bytes()[-2000:].decode("utf-8", "replace").strip().splitlines()
            except OSError:
                tail = []
            raise KvmtuneError(f"QEMU of probe guest {self.name} exited {proc.returncode}: "
                               f"{tail[-1] if tail else 'no error output'}")

    def last_console(self) -> str:
        """The guest's last non-empty console line (at most 120 characters), for a message."""
        try:
            lines = self.run.serial.read_bytes()[-4000:].decode("utf-8", "replace").splitlines()
        except OSError:
            return ""
        return next((ln for ln in reversed(lines) if ln.strip()), "")[:120]

    def connect(self, until: float, boot_timeout: float, watch_stopped: bool = False) -> None:
        """Wait (until the monotonic time ``until``) for the agent to answer. ``watch_stopped``: give up at once
        when QEMU has stopped the guest for good (a KVM internal error, a kernel panic), as its QMP run state says."""
        next_status = time.monotonic() + STATUS_EVERY_S
        while True:
            self.alive()
            if watch_stopped and time.monotonic() >= next_status:
                next_status = time.monotonic() + STATUS_EVERY_S
                state = self.run.query_status()
                if state in STOPPED_STATES:
                    try:
                        detail = kvm_error(self.run.stderr_path.read_bytes()[-2000:].decode("utf-8", "replace"))
                    except OSError:
                        detail = None
                    raise KvmtuneError(f"QEMU stopped the guest in its {state} state" + (f": {detail}" if detail else ""))
            left = until - time.monotonic()
            if left <= 0:
                raise KvmtuneError(f"the agent of probe guest {self.name} did not answer within {boot_timeout:.0f}s "
                                   f"(last console line: {self.last_console()!r})")
            if not self.socket.exists():
                time.sleep(0.1)
                continue
            try:
                self._agent = SocketAgent(str(self.socket), Deadline(min(left, 5.0)), allowed=PROBE_GUEST_COMMANDS)
                return
            except AgentError:
                continue

    @property
    def connected(self) -> bool:
        return self._agent is not None

    def close(self) -> None:
        if self._agent is not None:
            self._agent.close()
            self._agent = None

    def _call(self, command: str, arguments: dict[str, Any], seconds: float) -> Any:
        if self._agent is None:
            raise KvmtuneError(f"probe guest {self.name} is not running")
        self.alive()
        self._agent.deadline = Deadline(max(seconds, 1.0) + 10.0)
        try:
            return self._agent.call(command, arguments)
        except AgentError as exc:
            raise KvmtuneError(f"the agent of probe guest {self.name}: {exc}") from None

    def spawn(self, argv: list[str], capture: bool = False, env: list[str] | None = None) -> int:
        """Start ``argv`` (an absolute path first) in the guest and return its guest pid without waiting.

        ``env``: the command's whole environment (``NAME=value`` entries) instead of the agent's own."""
        if self._agent is None:
            raise KvmtuneError(f"probe guest {self.name} is not running")
        if not argv or not argv[0].startswith("/"):
            raise ValueError("guest-exec needs an absolute path")
        arguments: dict[str, Any] = {"path": argv[0], "arg": argv[1:], "capture-output": capture}
        if env is not None:
            arguments["env"] = env
        pid = self._call("guest-exec", arguments, 30.0)
        if not isinstance(pid, dict) or type(pid.get("pid")) is not int:
            raise KvmtuneError(f"probe guest {self.name}: guest-exec answered no pid")
        gpid: int = pid["pid"]
        return gpid

    def exec(self, argv: list[str], timeout: float, env: list[str] | None = None) -> ExecResult:
        """Run ``argv`` (an absolute path first) through ``guest-exec``; wait at most ``timeout`` seconds,
        then kill it (rc None). ``env`` as for :meth:`spawn`."""
        start = time.monotonic()
        gpid = self.spawn(argv, capture=True, env=env)
        poll = 0.02
        while True:
            status = self._call("guest-exec-status", {"pid": gpid}, 30.0)
            if not isinstance(status, dict):
                raise KvmtuneError(f"probe guest {self.name}: guest-exec-status answered no object")
            if status.get("exited") is True:
                code = status.get("exitcode")
                rc = code if type(code) is int else (128 + status["signal"] if type(status.get("signal")) is int else -1)
                return ExecResult(rc, _data(status, "out-data"), _data(status, "err-data"), time.monotonic() - start)
            if time.monotonic() - start > timeout:
                with contextlib.suppress(KvmtuneError):
                    self._call("guest-exec", {"path": "/bin/kill", "arg": ["-9", str(gpid)]}, 10.0)
                return ExecResult(None, "", "", time.monotonic() - start)
            time.sleep(poll)
            poll = min(poll * 2, 0.25)


def _data(status: dict[str, Any], key: str) -> str:
    raw = status.get(key)
    if not isinstance(raw, str):
        return ""
    try:
        data = base64.b64decode(raw[: -(-MAX_OUTPUT // 3) * 4], validate=True)  # whole 4-character groups only
    except (binascii.Error, ValueError):
        return ""
    return data[:MAX_OUTPUT].decode("utf-8", "replace")
