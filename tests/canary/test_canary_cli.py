"""``kvmtune canary``'s arguments: refused with one line and exit 2 before anything is measured."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvmtune.cli import main
from kvmtune.cli.canary import render_text, scratch_directory
from kvmtune.errors import UsageError


def test_dir_through_a_symlink_is_refused_with_its_target(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "link")
    with pytest.raises(UsageError, match="symbolic link"):
        scratch_directory(tmp_path / "link" , tmp_path)
    code = main(["canary", "run", "--quick", "--dir", str(tmp_path / "link"), "--db", str(tmp_path / "r.db")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and str(real) in err
    assert not (tmp_path / "r.db").exists()  # nothing written
    assert list(real.iterdir()) == []


def test_dir_through_a_symlinked_parent_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real" / "images").mkdir(parents=True)
    os.symlink(tmp_path / "real", tmp_path / "link")
    with pytest.raises(UsageError):
        scratch_directory(tmp_path / "link" / "images", tmp_path)
    assert scratch_directory(tmp_path / "real" / "images", tmp_path) == (tmp_path / "real" / "images").resolve()


def test_dir_default_is_the_work_directory(tmp_path: Path) -> None:
    assert scratch_directory(None, tmp_path) == tmp_path


def test_a_reset_is_recorded_with_its_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kvmtune.lab.store import Store

    assert main(["canary", "baseline", "--reset", "--reason", "new kernel 6.12", "--db", str(tmp_path / "r.db")]) == 0
    with Store(tmp_path / "r.db") as st:
        (run,) = st.runs()
    assert run.kind == "canary-reset" and run.note == "new kernel 6.12"


def test_text_names_the_change_or_says_nothing_changed() -> None:
    metric = {"name": "block.randread4k.qd32.iops", "value": 5000.0, "unit": "IOPS", "baseline": 10000.0, "ratio": 0.5,
              "interval": [0.45, 0.55], "verdict": "regression"}
    doc = {"run": 4, "suite": "1", "verdict": "regression", "busy": None, "metrics": [metric],
           "changed": [{"what": "linux-image-amd64", "before": "6.12.41-1", "after": "6.12.48-1\x1b[2J"}]}
    text = render_text(doc)
    assert "-50 % [-55 %, -45 %]" in text and "linux-image-amd64 6.12.41-1 → 6.12.48-1" in text
    assert "\x1b" not in text
    assert "nothing in the environment changed" in render_text(doc | {"changed": []})


def test_if_changed_skips_when_nothing_changed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kvmtune.canary.environment import collect
    from kvmtune.canary.judge import unchanged_since
    from kvmtune.host.root import HostRoot
    from kvmtune.lab.store import Store
    from kvmtune.runner import Runner

    work, images, db = tmp_path / "work", tmp_path / "images", tmp_path / "r.db"
    images.mkdir()
    env = collect(Runner(), HostRoot(), str(images)) | {"tier": "canary", "suite": "1"}
    with Store(db) as st:
        run = st.begin_run("canary", env, {"suite": "1"})
        st.finish_run(run, "complete")
        assert unchanged_since(st, env) == run
        assert unchanged_since(st, env | {"kernel": "6.99"}) is None
        assert unchanged_since(st, env | {"packages": {**env["packages"], "fio": "0-0"}}) is None
        assert unchanged_since(st, env | {"loadavg": [9.0, 9.0, 9.0]}) == run  # load is a figure, not a change
    argv = ["canary", "run", "--quick", "--if-changed", "--workdir", str(work), "--dir", str(images), "--db", str(db)]
    assert main(argv) == 0
    assert f"nothing changed since canary run {run}; not run" in capsys.readouterr().out
    with Store(db) as st:
        assert len(st.runs()) == 1
