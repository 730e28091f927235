"""A minimal synchronous QMP client: the probe guest's QEMU (bench/) and running guests' (``kvmtune top``)."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from pathlib import Path
from typing import Any

from kvmtune.errors import KvmtuneError

MAX_MESSAGE = 16 * 1024 * 1024  # one QMP reply; query-blockstats of hundreds of disks is a few hundred KiB


class Qmp:
    """A minimal synchronous QMP client."""

    def __init__(self, path: Path, timeout: float = 5.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sock.connect(str(path))
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    self.sock.close()
                    raise
                time.sleep(0.02)
        self._buf = b""
        self._read()  # greeting
        self.execute("qmp_capabilities")

    def _read(self) -> dict[str, Any]:
        while b"\n" not in self._buf:
            if len(self._buf) > MAX_MESSAGE:  # the QEMU of another user need not be QEMU: bound what it can make us hold
                raise ConnectionError(f"QMP message over {MAX_MESSAGE // (1024 * 1024)} MiB")
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("QMP socket closed")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            msg = json.loads(line)
        except RecursionError:
            raise ConnectionError("QMP message nested too deeply") from None
        if not isinstance(msg, dict):
            raise ConnectionError("QMP message is not a JSON object")
        return msg

    def execute(self, cmd: str, **args: Any) -> Any:
        req: dict[str, Any] = {"execute": cmd}
        if args:
            req["arguments"] = args
        self.sock.sendall(json.dumps(req).encode() + b"\n")
        while True:
            msg = self._read()
            if "event" in msg:
                continue
            if "error" in msg:
                raise KvmtuneError(f"QMP {cmd}: {msg['error'].get('desc', msg['error'])}")
            return msg.get("return")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
