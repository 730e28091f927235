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


def _serve(conn: socket.socket, on_sync: Callable[[int, int], bytes], on_command: Callable[[str, int], bytes],
           buf: bytes = b"") -> None:
    """Play an agent line by line: each ``guest-sync-delimited`` (its n-th) is answered with ``on_sync(n, id)``,
    each other command (its n-th) with ``on_command(name, n)``, until the client hangs up."""
    syncs = commands = 0
    with contextlib.suppress(OSError):  # the client may hang up first (an answer it cut off)
        while True:
            while b"\n" not in buf:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                buf += chunk
            line, buf = buf.split(b"\n", 1)
            req = json.loads(line.rsplit(b"\xff", 1)[-1])
            if req["execute"] == "guest-sync-delimited":
                conn.sendall(on_sync(syncs, req["arguments"]["id"]))
                syncs += 1
            else:
                conn.sendall(on_command(req["execute"], commands))
                commands += 1


def _synced(token: int) -> bytes:
    return b"\xff" + json.dumps({"return": token}).encode() + b"\n"


def _sync_then(reply: bytes) -> Callable[[socket.socket], None]:
    """Answer every sync properly (the first after some junk), and every command with ``reply``."""

    def behaviour(conn: socket.socket) -> None:
        _serve(conn, lambda n, token: (b"" if n else b"junk before the delimiter") + _synced(token),
               lambda command, n: reply)

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


def test_an_answer_nested_past_the_json_reader_is_one_agent_error(hostile: Callable[..., str]) -> None:
    """Within the size bound, 500,000 ``[`` were a RecursionError out of ``call``: the lab's probe agent (which
    catches AgentError) ended its whole run on the CLI's generic "nested too deeply" line, and the audit said only
    "its answers could not be read (RecursionError)"."""
    agent = SocketAgent(hostile(_sync_then(b"[" * 500_000 + b"\n")), Deadline(5))
    with pytest.raises(AgentError, match="guest-info: the answer is JSON nested too deeply to read"):
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
        conn.sendall(_synced(token))
        _serve(conn, lambda n, tok: _synced(tok),
               lambda command, n: json.dumps({"return": {"version": "7.2.0", "supported_commands": []}}).encode() + b"\n")

    agent = SocketAgent(hostile(behaviour), Deadline(5))
    assert agent.call("guest-info")["version"] == "7.2.0"
    agent.close()


def test_answers_are_matched_by_sync_id_not_by_order(hostile: Callable[..., str]) -> None:
    """Lines the agent sends unasked (before a sync's answer, an answer to an older sync, a second answer to
    one command) are dropped: each call gets its own command's answer."""

    def on_sync(n: int, token: int) -> bytes:
        if n == 0:  # the connection's
            return _synced(token)
        return (b'{"return": "unsolicited"}\n' + _synced(token ^ 1)  # an answer to a sync never sent
                + b"\xffnot json\n\n" + _synced(token))

    def on_command(command: str, n: int) -> bytes:
        answer = json.dumps({"return": f"{command} #{n}"}).encode() + b"\n"
        return answer + b'{"return": "a second answer"}\n{"error": {"desc": "stale"}}\n'  # extra lines

    agent = SocketAgent(hostile(lambda conn: _serve(conn, on_sync, on_command)), Deadline(5))
    assert [agent.call("guest-info") for _ in range(3)] == ["guest-info #0", "guest-info #1", "guest-info #2"]
    assert agent.call("guest-get-osinfo") == "guest-get-osinfo #3"
    agent.close()


def test_a_flood_of_stray_lines_is_one_error_not_a_wait(hostile: Callable[..., str]) -> None:
    def on_command(command: str, n: int) -> bytes:
        return b'{"return": "flood"}\n' * 1000

    agent = SocketAgent(hostile(lambda conn: _serve(conn, lambda n, token: _synced(token), on_command)), Deadline(20))
    started = time.monotonic()
    assert agent.call("guest-info") == "flood"  # and 999 more lines, which precede the next sync's answer
    with pytest.raises(AgentError, match="more than 64 lines that answer nothing"):
        agent.call("guest-info")
    assert time.monotonic() - started < 5
    agent.close()
