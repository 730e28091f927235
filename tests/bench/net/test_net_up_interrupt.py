"""``kvmtune net up``: Ctrl-C the instant the topology is announced is the normal end, not an interruption.

A reader (a test, a script) sends SIGINT as soon as it reads the JSON line; the signal can land before the
statement after the print runs. The topology here is a stand-in that raises KeyboardInterrupt the moment
it is described, which is where that signal lands in the worst case."""

from __future__ import annotations

from types import TracebackType
from typing import Any

import pytest

from kvmtune import cli
from kvmtune.cli import net


class _InterruptedWhenAnnounced:
    runid = "k1"

    def __init__(self) -> None:
        self.facts = {"down_s": 0.01}
        self.endpoints: list[Any] = []
        self.torn_down = False

    def __enter__(self) -> _InterruptedWhenAnnounced:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.torn_down = True

    def describe(self) -> dict[str, Any]:
        raise KeyboardInterrupt


def test_ctrl_c_as_the_topology_is_announced_tears_down_and_exits_0(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    topo = _InterruptedWhenAnnounced()
    monkeypatch.setattr(net, "make_topology", lambda spec, workdir=None: topo)
    assert cli.main(["net", "up", "--topology", "bridge"]) == 0
    assert topo.torn_down
    assert "topology k1 torn down" in capsys.readouterr().err
