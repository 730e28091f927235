"""The agent client and reader against hostile agents: garbage, escapes, silence, forbidden commands.

The "agent" here is the other end of a real Unix socket, played by a thread that sends what a
compromised guest could send; the real qemu-ga is exercised in tests/integration/test_guest_agent.py.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvmtune.audit.collect_agent import describe
from kvmtune.guestagent.client import AgentError, Deadline, ReplayAgent, SocketAgent
from kvmtune.guestagent.inside import read_inside


@pytest.fixture
def hostile(tmp_path: Path) -> Iterator[Callable[[Callable[[socket.socket], None]], str]]:
    threads: list[threading.Thread] = []
    servers: list[socket.socket] = []

    def serve(behaviour: Callable[[socket.socket], None]) -> str:
        path = str(tmp_path / f"qga{len(servers)}.sock")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(1)
        servers.append(server)

        def run() -> None:
            conn, _ = server.accept()
            with conn:
                behaviour(conn)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        threads.append(t)
        return path

    yield serve
    for s in servers:
        s.close()


def _sync_then(reply: bytes) -> Callable[[socket.socket], None]:
    """Answer the sync properly, then send ``reply`` to the first command."""

    def behaviour(conn: socket.socket) -> None:
        data = b""
        while b"\n" not in data:
            data += conn.recv(4096)
        token = json.loads(data.split(b"\xff", 1)[1].split(b"\n", 1)[0])["arguments"]["id"]
        conn.sendall(b"junk before the delimiter\xff" + json.dumps({"return": token}).encode() + b"\n")
        conn.recv(4096)
        with contextlib.suppress(OSError):  # the client may hang up first (an answer it cut off)
            conn.sendall(reply)
        time.sleep(0.5)

    return behaviour


def test_silent_agent_times_out_within_the_deadline(hostile: Callable[..., str]) -> None:
    path = hostile(lambda conn: time.sleep(3))
    started = time.monotonic()
    with pytest.raises(AgentError, match=r"no answer within 0\.5 s"):
        SocketAgent(path, Deadline(0.5))
    assert time.monotonic() - started < 2.5


def test_garbage_answer_is_one_error(hostile: Callable[..., str]) -> None:
    agent = SocketAgent(hostile(_sync_then(b"\x1b[2J not json\n")), Deadline(5))
    with pytest.raises(AgentError, match="not JSON"):
        agent.call("guest-info")
    agent.close()


def test_endless_answer_is_cut_off(hostile: Callable[..., str]) -> None:
    agent = SocketAgent(hostile(_sync_then(b"[" * (2 * 1024 * 1024))), Deadline(5))
    with pytest.raises(AgentError, match="longer than"):
        agent.call("guest-info")
    agent.close()


@pytest.mark.parametrize(("command", "arguments"), [
    ("guest-exec", {"path": "/bin/true"}),
    ("guest-file-write", {"handle": 1, "buf-b64": ""}),
    ("guest-fstrim", None),
    ("guest-file-open", {"path": "/etc/passwd", "mode": "w"}),
])
def test_only_read_only_commands_are_sent(command: str, arguments: dict[str, object] | None) -> None:
    with pytest.raises(AgentError, match=r"not a read-only|only mode 'r'"):
        ReplayAgent({}).call(command, arguments)


def test_hostile_values_never_reach_the_model() -> None:
    """Escape sequences, path tricks and absurd numbers are dropped and counted, not kept."""
    answers = {
        "guest-info": {"supported_commands": [{"name": "guest-file-open", "enabled": True}]},
        "guest-get-osinfo": {"id": "debian", "kernel-release": "6.1\x1b]0;pwned\x07"},
        "guest-get-disks": [{"name": "/dev/vd\x1b[1m", "partition": False},
                            {"name": "/dev/../../etc", "partition": False}],
        "file /sys/devices/system/clocksource/clocksource0/current_clocksource": "kvm-clock\x1b[31m\n",
        "file /proc/sys/kernel/random/entropy_avail": "99999999999999\n",
        "file /sys/kernel/mm/transparent_hugepage/enabled": "[never] \u202e\n",
        "file /proc/mounts": "/dev/vda1 /\x1b[2J ext4 rw,discard 0 0\n",
    }
    inside = read_inside(ReplayAgent(answers), "recorded")
    assert inside.kernel_release is None and inside.clocksource is None and inside.entropy_avail is None
    assert inside.thp_enabled is None and inside.discard_mounts == () and inside.schedulers == []
    # guest-get-disks is not among the enabled commands: it was not even asked
    assert "guest-get-disks" in inside.blocked
    assert {"current_clocksource", "entropy_avail"} <= set(inside.unreadable)
    assert "\x1b" not in describe(inside)


def test_file_access_blocked_leaves_values_unknown() -> None:
    answers = {"guest-info": {"supported_commands": [{"name": "guest-file-open", "enabled": False},
                                                     {"name": "guest-get-osinfo", "enabled": True}]},
               "guest-get-osinfo": {"id": "rhel", "kernel-release": "5.14.0-427.el9.x86_64"}}
    inside = read_inside(ReplayAgent(answers), "recorded", ("vda",))
    assert inside.os_kind == "linux" and inside.kernel_release == "5.14.0-427.el9.x86_64"
    assert inside.trim_scheduled is None and inside.clocksource is None and "guest-file-open" in inside.blocked


def test_a_sync_lost_before_the_guest_opened_its_port_is_sent_again(hostile: Callable[..., str]) -> None:
    """The first sync goes unanswered (written while the guest's end was closed); the second is answered."""

    def behaviour(conn: socket.socket) -> None:
        data = b""
        while data.count(b"\n") < 2:
            data += conn.recv(4096)
        second = data.split(b"\n")[1]
        token = json.loads(second.split(b"\xff", 1)[1])["arguments"]["id"]
        conn.sendall(b"\xff" + json.dumps({"return": token}).encode() + b"\n")
        conn.recv(4096)
        conn.sendall(json.dumps({"return": {"version": "7.2.0", "supported_commands": []}}).encode() + b"\n")
        time.sleep(0.5)

    agent = SocketAgent(hostile(behaviour), Deadline(5))
    assert agent.call("guest-info")["version"] == "7.2.0"
    agent.close()
