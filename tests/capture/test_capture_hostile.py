"""Hostile inputs to ``kvmtune capture`` (security review of issue 51): the marker in a shared work directory, a
marker naming a process that is no longer the QEMU it changed, QMP names with terminal escapes, trace lines written
into QEMU's stderr by someone else, and workload files from another host."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from kvmtune.capture import session
from kvmtune.capture.session import Capture, blockstats, identity, restore_leftovers
from kvmtune.errors import KvmtuneError
from kvmtune.host.root import HostRoot

QDEV = "/machine/peripheral/d0/virtio-backend"


class FakeQmp:
    """A guest's QMP that answers blockstats for one disk and records what it is sent."""

    def __init__(self, qdev: str = QDEV) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.qdev = qdev

    def execute(self, cmd: str, **args: Any) -> Any:
        self.sent.append((cmd, args))
        if cmd == "query-blockstats":
            return [{"device": "", "qdev": self.qdev, "stats": {"rd_operations": 1, "wr_operations": 1}}]
        return {}

    def close(self) -> None:
        pass


def capture(tmp_path: Path) -> Capture:
    return Capture(HostRoot(), os.getpid(), tmp_path, seconds=0.01, trace=False, tick=lambda s: None)


def me() -> dict[str, Any]:
    ident = identity(HostRoot(), os.getpid())
    assert ident is not None
    return ident


# --- the marker ----------------------------------------------------------------------------------------------


def test_a_symlink_planted_at_the_old_predictable_marker_name_is_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / f"capture-active-{os.getpid()}.json").symlink_to(victim)
    capture(tmp_path)._run(FakeQmp(), me())
    assert victim.read_text() == "precious\n"


def test_a_symlink_at_the_markers_own_name_refuses_the_capture_before_it_changes_anything(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session.secrets, "token_hex", lambda n: "0123456789abcdef")
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / f"capture-active-{os.getpid()}-0123456789abcdef.json").symlink_to(victim)
    qmp = FakeQmp()
    with pytest.raises(KvmtuneError, match="cannot create the capture marker"):
        capture(tmp_path)._run(qmp, me())
    assert victim.read_text() == "precious\n"
    assert not [c for c, _ in qmp.sent if c != "query-blockstats"]  # no histogram set, no event enabled


def test_the_marker_is_private_and_names_the_qemu_by_start_time_boot_and_owner(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def look(*a: Any, **k: Any) -> None:
        (marker,) = tmp_path.glob("capture-active-*.json")
        seen["mode"] = stat.S_IMODE(marker.stat().st_mode)
        seen["doc"] = json.loads(marker.read_text())

    cap = Capture(HostRoot(), os.getpid(), tmp_path, seconds=0.01, trace=False, tick=look)
    cap._run(FakeQmp(), me())
    assert seen["mode"] == 0o600
    assert {k: seen["doc"][k] for k in ("pid", "starttime", "uid", "boot_id")} == me()
    assert not list(tmp_path.glob("capture-active-*.json"))


def _marker(tmp_path: Path, **over: Any) -> Path:
    path = tmp_path / "capture-active-5.json"
    path.write_text(json.dumps({**me(), "events": ["virtio_blk_rw_complete"], "histograms": [QDEV], **over}))
    return path


@pytest.mark.parametrize("over", [{"uid": os.geteuid() + 1}, {"boot_id": "00000000-0000-0000-0000-000000000000"},
                                  {"starttime": 1}])
def test_a_marker_whose_pid_is_now_another_process_sends_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, over: dict[str, Any]) -> None:
    """Same pid, but another owner, another boot (start times repeat across reboots) or another start time: not
    the QEMU the capture changed, so no QMP is even looked for."""
    reached: list[int] = []
    monkeypatch.setattr(session, "reach", lambda host, pid, lv: reached.append(pid))
    _marker(tmp_path, **over)
    (line,) = restore_leftovers(HostRoot(), tmp_path)
    assert "has ended, nothing to restore" in line and reached == []


def test_a_marker_without_the_owner_and_boot_is_not_obeyed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session, "reach", lambda host, pid, lv: pytest.fail("reached"))
    path = _marker(tmp_path)
    doc = json.loads(path.read_text())
    del doc["uid"], doc["boot_id"]
    path.write_text(json.dumps(doc))
    (line,) = restore_leftovers(HostRoot(), tmp_path)
    assert "unreadable capture marker; removed" in line


def test_a_group_writable_marker_or_a_fifo_is_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session, "reach", lambda host, pid, lv: pytest.fail("reached"))
    path = _marker(tmp_path)
    path.chmod(0o666)
    os.mkfifo(tmp_path / "capture-active-6.json")  # opened without blocking, then refused
    lines = restore_leftovers(HostRoot(), tmp_path)
    assert len(lines) == 2 and all("not a capture marker of this user; left alone" in x for x in lines)
    assert path.exists()


def test_a_restored_line_never_carries_a_terminal_escape_and_only_plain_qdevs_are_sent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    qmp = FakeQmp()
    monkeypatch.setattr(session, "reach", lambda host, pid, lv: (qmp, lambda: None, None, ""))
    _marker(tmp_path, histograms=[QDEV, "x\x1b]0;pwned\x07", "a b", "../../etc"])
    (line,) = restore_leftovers(HostRoot(), tmp_path)
    assert [a.get("id") for c, a in qmp.sent if c == "block-latency-histogram-set"] == [QDEV, "../../etc"]
    assert "\x1b" not in line and "\x07" not in line

    def broken(host: HostRoot, pid: int, lv: Any) -> Any:
        raise KvmtuneError("libvirt says \x1b[2J\u2028fake line")
    monkeypatch.setattr(session, "reach", broken)
    _marker(tmp_path)
    (line,) = restore_leftovers(HostRoot(), tmp_path)
    assert "marker kept" in line and "\x1b" not in line and "\u2028" not in line


def test_a_qdev_out_of_pattern_in_a_qmp_reply_is_not_kept() -> None:
    got = blockstats(FakeQmp("/machine/peripheral/x\x1b]0;t\x07"))
    assert [v["qdev"] for v in got.values()] == [None]
    assert [v["qdev"] for v in blockstats(FakeQmp("/machine/peripheral-anon/device[0]/virtio-backend")).values()] \
        == ["/machine/peripheral-anon/device[0]/virtio-backend"]
