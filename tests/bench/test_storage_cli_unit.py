"""CLI behaviour that needs no guest: bad input, results listing, compare across accelerators."""

from __future__ import annotations

from pathlib import Path

import pytest

import kvmtune.cli as cli
from kvmtune.lab.store import Store


@pytest.fixture(autouse=True)
def private_cache_and_data(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # the guest cache and the default results database go to this test's own directories
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_unknown_cache_mode_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "storage", "--cache", "fast", "--runtime", "1"]) == 2
    assert "--cache: unknown cache 'fast'" in _one_line_error(capsys)


def test_unknown_workload_and_bad_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "storage", "--workload", "nope"]) == 2
    assert "unknown workload 'nope'" in _one_line_error(capsys)
    assert cli.main(["bench", "storage", "--runtime", "0"]) == 2
    assert "runtime must be > 0" in _one_line_error(capsys)
    assert cli.main(["bench", "storage", "--preset", "ffsb", "--workload", "zzz*"]) == 2
    assert "matches none of the preset's workloads" in _one_line_error(capsys)


def test_device_needs_the_destructive_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "storage", "--device", "/dev/vda"]) == 2
    assert "needs --destroy-data" in _one_line_error(capsys)


def test_mounted_device_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from kvmtune.bench.storage.guest import check_user_device
    from kvmtune.errors import KvmtuneError
    from kvmtune.host.root import HostRoot

    mounts = Path("/proc/mounts").read_text().splitlines()
    root_dev = next((ln.split()[0] for ln in mounts if ln.split()[1] == "/" and ln.startswith("/dev/")), None)
    if root_dev is None:
        pytest.skip("the root filesystem is not on a block device here")
    with pytest.raises(KvmtuneError, match=r"in use|busy"):
        check_user_device(HostRoot(), root_dev)
    with pytest.raises(KvmtuneError, match="not a block device"):
        check_user_device(HostRoot(), "/dev/null")


def test_results_list_empty_and_compare_refuses_across_accelerators(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "r.db"
    assert cli.main(["results", "list", "--db", str(db)]) == 2  # a read-only command creates no database
    assert "no such results database" in _one_line_error(capsys)
    Store(db).close()
    assert cli.main(["results", "list", "--db", str(db)]) == 0
    assert "no runs" in capsys.readouterr().out
    with Store(db) as st:
        for accel, iops in (("tcg", 100.0), ("kvm", 10000.0)):
            rid = st.begin_run("storage", {"accel": accel}, {})
            st.add_cell(rid, "k|w", {}, "w", "ok", {"iops": iops}, accel=accel)
            st.finish_run(rid, "complete")
    assert cli.main(["compare", "1", "2", "--db", str(db)]) == 2
    line = _one_line_error(capsys)
    assert "run 1 used tcg and run 2 used kvm" in line and "not comparable" in line
    assert cli.main(["compare", "1", "2", "--db", str(db), "--across-accelerators"]) == 0
    cap = capsys.readouterr()
    assert "WARNING: comparing tcg (run 1) with kvm (run 2)" in cap.err
    assert "+9900.0%" in cap.out
    assert cli.main(["results", "list", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "tcg" in out and "kvm" in out
    assert cli.main(["compare", "1", "7", "--db", str(db)]) == 2
    assert "no run 7" in _one_line_error(capsys)


def test_report_keeps_accelerators_apart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "r.db"
    with Store(db) as st:
        for accel in ("tcg", "kvm"):
            rid = st.begin_run("storage", {"accel": accel}, {})
            for pre, iops in (("off", 100.0), ("metadata", 300.0)):
                st.add_cell(rid, f"ide/qcow2-{pre}/writethrough/threads|fs-randwrite-4k",
                            {"bus": "ide", "fmt": "qcow2", "prealloc": pre, "cache": "writethrough"},
                            "fs-randwrite-4k", "ok", {"iops": iops, "bw_Bps": iops * 4096}, accel=accel)
            st.finish_run(rid, "complete")
    out_html = tmp_path / "r.html"
    assert cli.main(["report", "1", "2", "--db", str(db), "--html", str(out_html)]) == 0
    out = capsys.readouterr().out
    assert out.count("3.00× slower (fs-randwrite-4k, bus ide: 100 vs 300 IOPS) than with metadata") == 2  # once per accelerator
    text = out_html.read_text()
    assert "<h2>Accelerator kvm: " in text and "<h2>Accelerator tcg: " in text
    assert "no number is compared across them" in text
    assert text.count("<svg") >= 2  # a chart in each accelerator's section
