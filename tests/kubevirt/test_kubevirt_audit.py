"""``kvmtune audit`` on KubeVirt manifests: guests named ``kubevirt:NS/NAME``, findings at the manifest's line and
spec path, SARIF that validates and points there; the documentation's examples get their findings and a tuned VM
nothing above info. Fixtures name their sources in their first lines."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from kvmtune.cli import main

HERE = Path(__file__).parent
FIX = HERE / "fixtures"
SARIF_SCHEMA = Path(sys.prefix) / "share" / "sarif" / "sarif-2.1.0-rtm.5.json"


def audit_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    main(["audit", "--no-images", "--format", "json", *args])
    out = capsys.readouterr().out
    doc: dict[str, Any] = json.loads(out)
    return doc


def by_guest(doc: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for f in doc["findings"]:
        out.setdefault(f["target"]["domain"], []).append(f)
    return out


def line_of(path: str, line: int) -> str:
    return Path(path).read_text(encoding="utf-8").splitlines()[line - 1]


def test_a_tree_names_each_guest_and_resolves_instancetype_and_preference(capsys: pytest.CaptureFixture[str]) -> None:
    doc = audit_json(capsys, "--recursive", str(FIX / "tree"))
    guests = {g["name"] for g in doc.get("guests", [])} or set(by_guest(doc))
    assert {"kubevirt:web/web1", "kubevirt:web/web2"} <= guests
    found = by_guest(doc)
    # web1: the preference says virtio for the disk with no bus, so no emulated-bus finding; the instancetype's 4 vCPUs
    # make the IOThread and multiqueue advice apply
    rules1 = {f["rule"] for f in found["kubevirt:web/web1"]}
    assert "KVM-STO-001" not in rules1
    assert {"KVM-STO-009", "KVM-KUB-001", "KVM-NET-008"} <= rules1
    # web2 names an instancetype that is not given: said, never guessed
    text = json.dumps(doc)
    assert "instancetype VirtualMachineInstancetype web/clarge is not among the given objects" in text
    sata = [f for f in found["kubevirt:web/web2"] if f["rule"] == "KVM-STO-001"]
    assert sata and sata[0]["evidence"] == "spec.template.spec.domain.devices.disks[0].disk.bus"


def test_findings_carry_file_line_and_spec_path(capsys: pytest.CaptureFixture[str]) -> None:
    manifest = FIX / "examples" / "template-sata-e1000e.yaml"
    doc = audit_json(capsys, str(manifest))
    found = {f["rule"]: f for f in doc["findings"]}
    nic = found["KVM-NET-001"]["extra"]["location"]
    assert nic["file"] == str(manifest)
    assert nic["path"] == "spec.template.spec.domain.devices.interfaces[0].model"
    assert line_of(nic["file"], nic["line"]).strip() == "model: e1000e"
    assert nic["column"] == line_of(nic["file"], nic["line"]).index("model") + 1
    # a default (no bus written) points at the disk entry that lacks it
    bus = found["KVM-STO-001"]["extra"]["location"]
    assert bus["path"] == "spec.template.spec.domain.devices.disks[0].disk.bus" and bus["written"] is False
    assert line_of(bus["file"], bus["line"]).strip() == "disk: {}"
    assert "KubeVirt: set spec.template.spec.domain.devices.disks[0].disk.bus: virtio" in found["KVM-STO-001"]["fix"][
        "description"]
    misplaced = found["KVM-KUB-004"]
    assert misplaced["topic"] == "iothreads" and misplaced["severity"] == "high"
    assert line_of(str(manifest), misplaced["extra"]["location"]["line"]).strip() == "ioThreadsPolicy: auto"


def test_sarif_validates_and_points_at_the_lines(capsys: pytest.CaptureFixture[str]) -> None:
    assert SARIF_SCHEMA.is_file(), f"{SARIF_SCHEMA} missing: scripts/install.sh fetches it"
    main(["audit", "--no-images", "--format", "sarif", "--recursive", str(FIX)])
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, json.loads(SARIF_SCHEMA.read_text()), cls=jsonschema.Draft4Validator)
    results = doc["runs"][0]["results"]
    assert results
    for res in results:
        phys = res["locations"][0]["physicalLocation"]
        region = phys["region"]
        evidence = res["properties"]["evidence"]
        path = evidence.split(" (", 1)[0]
        uri = phys["artifactLocation"]["uri"]  # an absolute path loses its "/" (sarif._uri): relative to the root
        text = line_of(uri if Path(uri).exists() else "/" + uri, region["startLine"])
        parts = [p.split("[", 1)[0] for p in path.split(".")]
        if "(not set" not in evidence and not path.endswith("]"):
            assert parts[-1] + ":" in text, (res["ruleId"], path, text)  # the field itself
        else:  # a default, or a list entry: the closest written part of its path
            assert any(p + ":" in text for p in parts) or text.lstrip().startswith("- "), (res["ruleId"], path, text)


def test_examples_get_the_advice_and_the_tuned_vm_nothing_above_info(capsys: pytest.CaptureFixture[str]) -> None:
    found = by_guest(audit_json(capsys, str(FIX / "examples"), str(FIX / "tuned")))
    testvm = {f["rule"] for f in found["kubevirt:labs/testvm"]}
    assert {"KVM-STO-009", "KVM-KUB-001", "KVM-NET-008"} <= testvm  # iothreads, block and net multiqueue
    legacy = {f["rule"] for f in found["kubevirt:apps/legacy"]}
    assert {"KVM-STO-001", "KVM-NET-001", "KVM-KUB-004"} <= legacy  # sata (the default), e1000e, misplaced field
    tuned = found.get("kubevirt:prod/db", [])
    assert [f["rule"] for f in tuned if f["severity"] != "info"] == []


def test_a_directory_is_one_level_without_recursive(capsys: pytest.CaptureFixture[str]) -> None:
    doc = audit_json(capsys, str(FIX / "tree"))
    text = json.dumps(doc)
    assert "1 subdirectory not read (--recursive reads the tree)" in text
    # the preference lives in base/, so without it web1's disk keeps KubeVirt's default bus
    assert "virtio-everywhere is not among the given objects" in text


def test_a_pool_and_a_vmi_are_guests_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "pool.json").write_text(json.dumps({
        "apiVersion": "pool.kubevirt.io/v1alpha1", "kind": "VirtualMachinePool",
        "metadata": {"name": "p", "namespace": "n"},
        "spec": {"replicas": 2, "virtualMachineTemplate": {"spec": {"template": {"spec": {"domain": {
            "cpu": {"cores": 2}, "devices": {"interfaces": [{"name": "x", "model": "e1000e", "bridge": {}}]},
            "memory": {"guest": "1Gi"}}}}}}}}))
    (tmp_path / "vmi.yaml").write_text("apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata:\n"
                                       "  name: i\n  namespace: n\nspec:\n  domain:\n    devices:\n      disks:\n"
                                       "      - name: d\n        disk: {bus: sata}\n")
    found = by_guest(audit_json(capsys, str(tmp_path)))
    assert "KVM-NET-001" in {f["rule"] for f in found["kubevirt:n/p"]}
    vmi = [f for f in found["kubevirt:n/i"] if f["rule"] == "KVM-STO-001"]
    assert vmi and vmi[0]["evidence"] == "spec.domain.devices.disks[0].disk.bus"


@pytest.mark.parametrize("name", ["vm-cirros.yaml"])
def test_a_copy_elsewhere_is_located_in_the_copy(tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(FIX / "examples" / name, tmp_path / name)
    doc = audit_json(capsys, str(tmp_path / name))
    assert all(f["extra"]["location"]["file"] == str(tmp_path / name) for f in doc["findings"])


@pytest.mark.parametrize("command", ["verify"])  # fix edits manifests: tests/kubevirt/test_manifest_fix.py
def test_verify_refuses_a_manifest_in_one_line(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = str(FIX / "tuned" / "tuned-vm.yaml")
    assert main([command, manifest]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{manifest}: a KubeVirt manifest" in err
