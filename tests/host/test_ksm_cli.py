"""``kvmtune ksm`` on the fixture hosts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvmtune.cli import main

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"


def ksm(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["ksm", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_overcommitted_host_text(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = ksm(["--root", str(HOSTS / "ksm-overcommit")], capsys)
    assert code == 0 and err == ""
    assert "running" in out.splitlines()[0]
    lines = {" ".join(ln.split()[:2]): ln.split() for ln in out.splitlines()}
    assert lines["pages_sharing 3,145,728"]
    assert lines["sharing ratio"][2] == "6.00" and lines["waste ratio"][2] == "0.33"
    assert lines["memory saved"][2:4] == ["12.0", "GiB"]
    assert lines["ksmd CPU"][2] == "12.00%"
    assert "12 running, 96.0 GiB assigned on 64.0 GiB RAM (1.50×)" in out
    assert "merge_across_nodes=1 on 2 NUMA nodes" in out


def test_json_and_advice_without_overcommit(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = ksm(["--root", str(HOSTS / "rhel6-old"), "--format", "json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["run"] == 1 and doc["counters"]["pages_unshared"] == 91000
    assert doc["waste_ratio"] == pytest.approx(91000 / 3100)
    advice = " ".join(doc["advice"])
    assert "fits without KSM" in advice and "KVM-HST-005" in advice
    assert "wasted effort" in advice


def test_advice_on_a_pve_node_leaves_ksm_to_ksmtuned(capsys: pytest.CaptureFixture[str], make_variant) -> None:  # type: ignore[no-untyped-def]
    root = make_variant("rhel6-old", {"/etc/pve/storage.cfg": "dir: local\n\tpath /var/lib/vz\n",
                                      "/proc/4242/comm": "ksmtuned\n"})
    code, out, _ = ksm(["--root", str(root), "--format", "json"], capsys)
    doc = json.loads(out)
    advice = " ".join(doc["advice"])
    assert code == 0 and doc["ksmtuned_thres_coef"] == 20
    assert "ksmtuned started it" in advice and "KSM_THRES_COEF in /etc/ksmtuned.conf" in advice
    assert "Consider echo 2" not in advice


def test_ksm_off_and_absent(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = ksm(["--root", str(HOSTS / "nvme-modern")], capsys)
    assert code == 0 and "stopped" in out and "Nothing to change" in out
    (tmp_path / "proc").mkdir()
    code, out, _ = ksm(["--root", str(tmp_path)], capsys)
    assert code == 0 and "not available" in out


def test_garbled_counter(capsys: pytest.CaptureFixture[str], make_variant) -> None:  # type: ignore[no-untyped-def]
    root = make_variant("ksm-overcommit", {"/sys/kernel/mm/ksm/pages_shared": "lots\n"})
    code, out, err = ksm(["--root", str(root)], capsys)
    assert code == 2 and "pages_shared: holds 'lots'" in err and "Traceback" not in err
    assert "3,145,728" in out


def test_live(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = ksm([], capsys)
    assert code in (0, 2) and out.startswith("KSM on this host")
