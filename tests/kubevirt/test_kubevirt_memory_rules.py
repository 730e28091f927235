"""KVM-KUB-010 (hugepages with a request that does not match) and KVM-KUB-011 (the overhead not requested): which
case is which severity, what the finding says, and that KVM-KUB-006 leaves a hugepage-backed VM to KVM-KUB-010."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.audit.finding import Finding, Severity
from kvmtune.audit.rule import rule_by_id
from kvmtune.host.root import HostRoot
from kvmtune.kubevirt.guest import guests_from_objects
from kvmtune.kubevirt.load import read_file

VM = """apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {{name: vm, namespace: t}}
spec:
  template:
    spec:
      domain:
        cpu: {{cores: 2}}
        memory: {memory}
        resources: {resources}
"""


def findings(tmp_path: Path, memory: str, resources: str, *rules: str) -> list[Finding]:
    manifest = tmp_path / "vm.yaml"
    manifest.write_text(VM.format(memory=memory, resources=resources))
    guests, _ = guests_from_objects(read_file(str(manifest)))
    chosen = [r for r in (rule_by_id(i) for i in rules) if r is not None]
    return run_rules(AuditContext(host=HostRoot("/nonexistent-root")), guests, rules=chosen)


@pytest.mark.parametrize(("memory", "resources", "severity", "said"), [
    ("{guest: 8Gi, hugepages: {pageSize: 1Gi}}", "{requests: {memory: 4Gi}}", Severity.HIGH,
     "memory.guest 8192 MiB backed by hugepages, the pod given 4096 MiB of them"),
    ("{hugepages: {pageSize: 1Gi}}", "{requests: {memory: 1536Mi}}", Severity.HIGH, "not a whole number of pages"),
    ("{guest: 8Gi, hugepages: {pageSize: 1Gi}}", "{requests: {memory: 8G}}", Severity.HIGH,
     "not a whole number of pages"),  # 8G is 8 * 10^9 bytes: not whole GiB pages
    ("{hugepages: {pageSize: 1Gi}}", "{requests: {memory: 512Mi}}", Severity.HIGH, "smaller than a page"),
    ("{guest: 1Gi, hugepages: {pageSize: 2Mi}}", "{}", None, ""),  # the request is memory.guest: whole pages
    ("{guest: 4Gi, hugepages: {pageSize: 2Mi}}", "{requests: {memory: 6Gi}}", Severity.LOW,
     "2048 MiB requested as ordinary memory the guest never gets"),
    ("{guest: 8Gi, hugepages: {pageSize: 1Gi}}", "{requests: {memory: 8Gi}}", None, ""),
    ("{guest: 8Gi}", "{requests: {memory: 4Gi}}", None, ""),  # no hugepages: KVM-KUB-006's
])
def test_hugepages_request_cases(tmp_path: Path, memory: str, resources: str, severity: Severity | None,
                                 said: str) -> None:
    found = findings(tmp_path, memory, resources, "KVM-KUB-010")
    assert [f.severity for f in found] == ([severity] if severity else [])
    if found:
        assert said in found[0].actual
        assert found[0].evidence == "spec.template.spec.domain.resources.requests.memory"


def test_a_hugepage_vm_below_its_request_is_kub_010s_not_kub_006s(tmp_path: Path) -> None:
    found = findings(tmp_path, "{guest: 8Gi, hugepages: {pageSize: 1Gi}}", "{requests: {memory: 4Gi}}",
                     "KVM-KUB-006", "KVM-KUB-010")
    assert [f.rule for f in found] == ["KVM-KUB-010"]
    assert [f.rule for f in findings(tmp_path, "{guest: 8Gi}", "{requests: {memory: 4Gi}}", "KVM-KUB-006",
                                     "KVM-KUB-010")] == ["KVM-KUB-006"]


@pytest.mark.parametrize(("resources", "memory", "mib"), [
    # 1 GiB guest, 2 vCPUs: 2 MiB page tables + 240 processes + 16 vCPUs + 8 IOThread + 32 video = 298
    ("{overcommitGuestOverhead: true, requests: {memory: 1Gi}}", "{}", 298),
    ("{overcommitGuestOverhead: true, requests: {memory: 1Gi}}", "{guest: 1Gi}", 298),
    ("{overcommitGuestOverhead: false, requests: {memory: 1Gi}}", "{}", None),
    ("{overcommitGuestOverhead: 'true', requests: {memory: 1Gi}}", "{}", None),  # a string is not KubeVirt's bool
    ("{limits: {memory: 1Gi}, requests: {memory: 1Gi}}", "{guest: 1Gi}", None),  # KubeVirt adds it to the limit
])
def test_overhead_not_requested(tmp_path: Path, resources: str, memory: str, mib: int | None) -> None:
    found = findings(tmp_path, memory, resources, "KVM-KUB-011")
    assert len(found) == (1 if mib else 0)
    if mib:
        assert found[0].severity == Severity.MEDIUM and found[0].topic == "memory-overcommit"
        assert f"about {mib} MiB of KubeVirt's estimated overhead not requested" in found[0].actual
        assert found[0].evidence == "spec.template.spec.domain.resources.overcommitGuestOverhead"
