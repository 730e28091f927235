"""KVM-HST-001 takes the cached `kvmtune guest accel` verdict as evidence (live root only)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import rule_by_id
from kvmtune.host.root import HostRoot
from kvmtune.lab.accel_cache import read_cached_verdict, verdict_for

OSRELEASE = Path("/proc/sys/kernel/osrelease").read_text().strip()


def write_verdict(workdir: Path, accel: str, reason: str, *, osrelease: str = OSRELEASE, age_s: float = 60) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "accel.json"
    choice = {"accel": accel, "reason": reason, "probe_s": 8.0, "cached": False}
    path.write_text(json.dumps({"key": f"abc|QEMU 7.2.0|{osrelease}", "at": time.time() - age_s, "choice": choice}))
    return path


def live_hst001(monkeypatch: pytest.MonkeyPatch, cache_home: Path) -> list:  # type: ignore[type-arg]
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    rule = rule_by_id("KVM-HST-001")
    assert rule is not None
    host = HostRoot("/")  # as the CLI builds it: bench/'s cache read by the caller, passed in
    return run_rules(AuditContext(host=host, accel_verdict=verdict_for(host)), audit_host=True, rules=[rule])


@pytest.fixture
def usable_dev_kvm() -> None:
    if not os.path.exists("/dev/kvm") or not os.access("/dev/kvm", os.R_OK | os.W_OK):
        pytest.skip("needs a /dev/kvm this user can open (the verdict is evidence only once /dev/kvm opens)")


@pytest.mark.usefixtures("usable_dev_kvm")
def test_cached_tcg_verdict_is_a_critical_finding_naming_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = write_verdict(tmp_path / "kvmtune", "tcg", "a probe guest did not boot under KVM within 8s")
    findings = live_hst001(monkeypatch, tmp_path)
    assert len(findings) == 1
    f = findings[0]
    assert f.severity == Severity.CRITICAL
    assert "did not boot under KVM" in f.actual
    assert str(cache) in f.evidence


@pytest.mark.usefixtures("usable_dev_kvm")
def test_cached_kvm_verdict_outweighs_missing_cpu_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_verdict(tmp_path / "kvmtune", "kvm", "probe guest booted under KVM in 0.4s")
    findings = live_hst001(monkeypatch, tmp_path)
    assert not [f for f in findings if "vmx/svm" in f.actual or "guest accel" in f.actual]


def test_a_verdict_for_another_kernel_or_too_old_is_not_evidence(tmp_path: Path) -> None:
    write_verdict(tmp_path, "tcg", "x", osrelease="5.10.0-other")
    assert read_cached_verdict(tmp_path, OSRELEASE) is None
    write_verdict(tmp_path, "tcg", "x", age_s=2 * 86400)
    assert read_cached_verdict(tmp_path, OSRELEASE) is None
    write_verdict(tmp_path, "tcg", "x")
    verdict = read_cached_verdict(tmp_path, OSRELEASE)
    assert verdict is not None and verdict.accel == "tcg"


@pytest.mark.usefixtures("usable_dev_kvm")
def test_the_audit_command_passes_the_cached_verdict_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """host/ reads no cache of bench/: `kvmtune audit --host` reads it and hands it to the host facts."""
    from kvmtune.cli import main

    cache = write_verdict(tmp_path / "kvmtune", "tcg", "a probe guest did not boot under KVM within 8s")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    out = tmp_path / "audit.json"
    main(["audit", "--host", "--no-images", "--only", "KVM-HST-001", "--format", "json", "-o", str(out)])
    findings = [f for f in json.loads(out.read_text())["findings"] if f["rule"] == "KVM-HST-001"]
    assert [str(cache) in f["evidence"] for f in findings] == [True]
