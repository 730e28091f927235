"""Talking to a QEMU guest agent: over the socket QEMU listens on, or through libvirt.

Every call has a time-out taken from one deadline per guest, so an agent that does not answer,
answers slowly or answers garbage costs that guest's time budget and nothing more. Replies are
read with a size limit and parsed as JSON only; what they contain is the guest's and is checked
field by field by the caller (``inside.py``). Only read-only commands are ever sent (the caller
names them; this module refuses any other).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import time
from typing import Any, Protocol

from kvmtune.errors import KvmtuneError

MAX_REPLY_BYTES = 1024 * 1024
SYNC_RESEND_S = 1.0
# lines dropped while waiting for one sync's answer: a late answer to an earlier command, lines sent unasked
MAX_STRAY_LINES = 64
# what kvmtune may ask a guest agent: nothing that writes, executes or changes the guest
READ_ONLY_COMMANDS = frozenset({
    "guest-sync-delimited", "guest-info", "guest-get-osinfo", "guest-get-disks", "guest-get-devices",
    "guest-file-open", "guest-file-read", "guest-file-close",
})
# kvmtune's own probe guest (the probe-guest pair, ``lab/probe/pair.py``) also runs its workloads through its agent;
# no other guest is ever sent these
PROBE_GUEST_COMMANDS = READ_ONLY_COMMANDS | frozenset({"guest-exec", "guest-exec-status"})


class AgentError(KvmtuneError):
    """The agent did not answer in time, answered garbage, or refused the command."""


class AgentRefused(AgentError):
    """The agent answered with an error object (``desc`` is the guest's text: print it escaped)."""

    def __init__(self, command: str, desc: str) -> None:
        super().__init__(f"{command}: refused")
        self.command = command
        self.desc = desc


class _Resend(Exception):
    """No answer to this sync yet: send another."""


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        remaining = self.end - time.monotonic()
        if remaining <= 0:
            raise AgentError(f"no answer within {self.seconds:g} s")
        return remaining


class Agent(Protocol):
    def call(self, command: str, arguments: dict[str, Any] | None = None) -> Any: ...

    def close(self) -> None: ...


def _request(command: str, arguments: dict[str, Any] | None, allowed: frozenset[str] = READ_ONLY_COMMANDS) -> str:
    if command not in allowed:
        raise AgentError(f"{command}: not a read-only agent command; kvmtune does not send it")
    if command == "guest-file-open" and (arguments or {}).get("mode") != "r":
        raise AgentError("guest-file-open: only mode 'r' is allowed")
    req: dict[str, Any] = {"execute": command}
    if arguments:
        req["arguments"] = arguments
    return json.dumps(req)


def _reply(command: str, raw: bytes | str) -> Any:
    try:
        msg = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise AgentError(f"{command}: the answer is not JSON") from None
    except RecursionError:  # within MAX_REPLY_BYTES, [[[... is far deeper than Python's JSON reader recurses
        raise AgentError(f"{command}: the answer is JSON nested too deeply to read") from None
    if not isinstance(msg, dict):
        raise AgentError(f"{command}: the answer is not a JSON object")
    if "error" in msg:
        err = msg["error"]
        desc = err.get("desc") if isinstance(err, dict) else None
        raise AgentRefused(command, desc if isinstance(desc, str) else "")
    if "return" not in msg:
        raise AgentError(f"{command}: the answer has no 'return'")
    return msg["return"]


class SocketAgent:
    """The agent behind a QEMU ``virtserialport`` whose chardev is a socket QEMU listens on.

    Answers carry nothing that names their request, so each command goes after a
    ``guest-sync-delimited`` with a fresh random id (its answer starts with a 0xFF byte): what comes
    before that sync's answer (half a request from an earlier client, an earlier command's late or
    extra answer, lines the agent sent unasked) is dropped, up to :data:`MAX_STRAY_LINES` lines, and the
    line after it is the command's answer. An extra line can no longer shift later answers.
    """

    def __init__(self, path: str, deadline: Deadline, allowed: frozenset[str] = READ_ONLY_COMMANDS) -> None:
        self.deadline = deadline
        self.allowed = allowed  # PROBE_GUEST_COMMANDS only for kvmtune's own probe guest
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._buf = b""
        try:
            self.sock.settimeout(deadline.left())
            self.sock.connect(path)
        except OSError as exc:
            self.sock.close()
            raise AgentError(f"cannot connect ({exc.strerror or exc.__class__.__name__})") from None
        self._sync()

    def _send(self, data: bytes) -> None:
        try:
            self.sock.settimeout(self.deadline.left())
            self.sock.sendall(data)
        except OSError as exc:
            raise AgentError(f"cannot send ({exc.strerror or 'timed out'})") from None

    def _recv(self, until: float | None = None) -> None:
        left = self.deadline.left()
        if until is not None:
            if until - time.monotonic() <= 0:
                raise _Resend
            left = min(left, until - time.monotonic())
        try:
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
        except TimeoutError:
            if until is not None and time.monotonic() < self.deadline.end:
                raise _Resend from None
            raise AgentError(f"no answer within {self.deadline.seconds:g} s") from None
        except OSError as exc:
            raise AgentError(f"cannot read ({exc.strerror})") from None
        if not chunk:
            raise AgentError("the agent socket closed")
        self._buf += chunk
        if len(self._buf) > MAX_REPLY_BYTES:
            raise AgentError(f"an answer longer than {MAX_REPLY_BYTES} bytes")

    def _line(self, until: float | None = None) -> bytes:
        while b"\n" not in self._buf:
            self._recv(until)
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    @staticmethod
    def _sync_request() -> tuple[int, bytes]:
        token = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
        return token, b"\xff" + _request("guest-sync-delimited", {"id": token}).encode() + b"\n"

    def _sync(self) -> None:
        """Resend the sync every second until one is answered: what was written before the guest opened
        its end of the port is lost, so a single request could wait for the whole deadline."""
        while True:
            token, request = self._sync_request()
            self._send(request)
            try:
                self._await_sync(token, until=time.monotonic() + SYNC_RESEND_S)
                return
            except _Resend:
                continue

    def _await_sync(self, token: int, until: float | None = None) -> None:
        """Read up to the answer to the sync with ``token``, dropping what comes before it (bounded)."""
        stray = 0
        while True:
            while b"\xff" not in self._buf:
                stray += self._buf.count(b"\n")
                self._buf = b""
                self._check_stray(stray)
                self._recv(until)
            before, self._buf = self._buf.split(b"\xff", 1)
            stray += before.count(b"\n")
            line = self._line(until).strip()
            try:
                answer = _reply("guest-sync-delimited", line)
            except AgentError:
                answer = None
            if type(answer) is int and answer == token:
                return
            stray += 1  # an earlier sync's answer, or a 0xFF byte in something else
            self._check_stray(stray)

    @staticmethod
    def _check_stray(stray: int) -> None:
        if stray > MAX_STRAY_LINES:
            raise AgentError(f"more than {MAX_STRAY_LINES} lines that answer nothing kvmtune asked")

    def call(self, command: str, arguments: dict[str, Any] | None = None) -> Any:
        request = _request(command, arguments, self.allowed).encode() + b"\n"
        token, sync = self._sync_request()
        self._send(sync + request)
        self._await_sync(token)
        while True:
            line = self._line().strip()
            if line:  # the agent may send blank lines between answers
                return _reply(command, line)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class LibvirtAgent:
    """The agent of a libvirt domain, through ``virDomainQemuAgentCommand`` (libvirt syncs itself)."""

    def __init__(self, domain: Any, deadline: Deadline) -> None:
        import libvirt
        import libvirt_qemu

        self._libvirt = libvirt
        self._qemu = libvirt_qemu
        self.domain = domain
        self.deadline = deadline

    def call(self, command: str, arguments: dict[str, Any] | None = None) -> Any:
        request = _request(command, arguments)
        seconds = max(1, int(self.deadline.left() + 0.999))
        try:
            raw = self._qemu.qemuAgentCommand(self.domain, request, seconds, 0)
        except self._libvirt.libvirtError as exc:
            text = (str(exc).strip().splitlines() or ["libvirt error"])[0]
            # the agent's own error (e.g. a file that does not exist) comes back as an internal error
            # naming the command; an unresponsive or unsynced agent has codes of its own
            if "unable to execute QEMU agent command" in text:
                raise AgentRefused(command, text) from None
            raise AgentError(text) from None
        if raw is None:
            raise AgentError(f"{command}: no answer")
        if len(raw) > MAX_REPLY_BYTES:
            raise AgentError(f"an answer longer than {MAX_REPLY_BYTES} bytes")
        return _reply(command, raw)

    def close(self) -> None:
        pass


class ReplayAgent:
    """Answers recorded from a real agent (``{"command": reply, "file /path": text or a read reply}``);
    the rule fixtures feed them through the same reading code as a live agent."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self._open: dict[int, str] = {}

    def call(self, command: str, arguments: dict[str, Any] | None = None) -> Any:
        _request(command, arguments)
        args = arguments or {}
        if command == "guest-file-open":
            key = f"file {args.get('path')}"
            if key not in self.answers:
                raise AgentRefused(command, "No such file or directory")
            handle = len(self._open) + 1000
            self._open[handle] = key
            return handle
        if command == "guest-file-read":
            answer = self.answers[self._open[int(args["handle"])]]
            if isinstance(answer, str):  # fixtures keep a file's text; the agent sends it in base64
                data = answer.encode()
                return {"count": len(data), "buf-b64": base64.b64encode(data).decode(), "eof": True}
            return answer
        if command == "guest-file-close":
            self._open.pop(int(args["handle"]), None)
            return {}
        if command not in self.answers:
            raise AgentRefused(command, "The command has not been found")
        reply = self.answers[command]
        if isinstance(reply, dict) and set(reply) == {"error"}:
            raise AgentRefused(command, str(reply["error"]))
        return reply

    def close(self) -> None:
        pass
