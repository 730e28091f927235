"""``kvmtune canary fleet``: two fixture hosts' regressions grouped by the package change they share; other hosts'
documents read as hostile."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from kvmtune.canary.fleet import group, load
from kvmtune.cli import main
from kvmtune.errors import InputError

IOPS = "block.randread4k.qd32.iops"
QEMU = {"what": "qemu-system-x86", "before": "1:10.0.3", "after": "1:10.0.6"}


def doc(host: str, verdict: str, ratio: float, changed: list[dict[str, str]]) -> dict[str, Any]:
    return {"suite": "1", "run": 9, "verdict": verdict, "busy": None, "environment": {"hostname": host},
            "metrics": [{"name": IOPS, "value": 1.0, "unit": "IOPS", "baseline": 1.0, "ratio": ratio,
                         "interval": [ratio - 0.03, ratio + 0.03],
                         "verdict": "regression" if verdict == "regression" else "no-change"}],
            "changed": changed}


def write(tmp_path: Path, name: str, content: Any) -> str:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def test_two_hosts_grouped_by_their_shared_package_change(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = [write(tmp_path, "a.json", doc("kvm-a", "regression", 0.88, [QEMU])),
             write(tmp_path, "b.json", doc("kvm-b", "regression", 0.86, [QEMU, {"what": "governor", "before": "performance",
                                                                           "after": "powersave"}])),
             write(tmp_path, "c.json", doc("kvm-c", "no-regression", 1.0, [QEMU]))]
    groups = group([load(f) for f in files])
    assert groups[0]["change"] == QEMU and groups[0]["hosts"] == ["kvm-a", "kvm-b"]
    assert groups[0]["metrics"][0]["name"] == IOPS and 0.86 < groups[0]["metrics"][0]["ratio"] < 0.88
    assert groups[1]["hosts"] == ["kvm-b"]
    assert main(["canary", "fleet", *files]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == ("2 host(s) that took qemu-system-x86 1:10.0.3 → 1:10.0.6: "
                                   "block.randread4k.qd32.iops -13 % [-17 %, -9 %]")


def test_a_regression_with_no_change_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = write(tmp_path, "a.json", doc("kvm-a", "regression", 0.5, []))
    assert main(["canary", "fleet", f]) == 0
    assert "nothing changed (load or hardware)" in capsys.readouterr().out


def test_hostile_names_are_printed_safely(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    evil = {"what": "qemu\x1b[2J\u2028x", "before": "1", "after": "2\r"}
    f = write(tmp_path, "a.json", doc("kvm\x1b]0;x\x07", "regression", 0.5, [evil]))
    assert main(["canary", "fleet", f]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u2028" not in out and "\r" not in out


@pytest.mark.parametrize("content", [
    "not json", [], {"suite": "0"}, {**doc("a", "regression", 0.5, []), "verdict": "pwned"},
    {**doc("a", "regression", 0.5, []), "environment": {"hostname": ""}},
    {**doc("a", "regression", 0.5, []), "changed": [{"what": 1, "before": "a", "after": "b"}]},
    {**doc("a", "regression", 0.5, []), "metrics": [{"name": IOPS, "verdict": "regression", "ratio": "NaN",
                                                      "interval": [0.4, 0.6]}]},
    {**doc("a", "regression", 0.5, []), "metrics": [{"name": IOPS, "verdict": "regression", "ratio": -1,
                                                      "interval": [0.4, 0.6]}]},
    "[" * 100000,
])
def test_a_document_that_does_not_fit_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          content: Any) -> None:
    f = write(tmp_path, "bad.json", content)
    assert main(["canary", "fleet", f]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "bad.json" in err


def test_links_fifos_and_oversize_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(InputError, match="not a regular file"):
        load(str(tmp_path / "fifo"))
    big = tmp_path / "big.json"
    big.write_text(" " * (5 << 20))
    with pytest.raises(InputError):
        load(str(big))
    os.symlink("/proc/self/status", tmp_path / "link.json")
    with pytest.raises(InputError):
        load(str(tmp_path / "link.json"))  # a link to a /proc file: not a canary document, refused
