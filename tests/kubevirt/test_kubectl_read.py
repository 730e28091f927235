"""``kvmtune audit --kubevirt [CONTEXT]`` reads a cluster through ``kubectl get`` (read-only). No real cluster and no
``kubectl`` this machine may have is used: ``tests/fix/standins/kubectl.py`` is first on PATH and answers from the
fixture manifests (``tests/kubevirt/fixtures/``), as kubectl prints them: a ``kind: List`` per kind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubectl_standin import standin_env

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
STANDIN = HERE.parent / "fix" / "standins" / "kubectl.py"
FIX = HERE / "fixtures"
KIND_OF = {"VirtualMachine": "virtualmachines.kubevirt.io",
           "VirtualMachineInstancetype": "virtualmachineinstancetypes.instancetype.kubevirt.io",
           "VirtualMachineClusterPreference": "virtualmachineclusterpreferences.instancetype.kubevirt.io"}


class Cluster:
    def __init__(self, tmp: Path) -> None:
        self.answers = tmp / "answers"
        self.answers.mkdir()
        lists: dict[str, list[Any]] = {}
        for manifest in sorted(FIX.rglob("*.yaml")):
            for doc in yaml.safe_load_all(manifest.read_text()):
                for obj in doc["items"] if doc.get("kind") == "List" else [doc]:
                    lists.setdefault(KIND_OF[obj["kind"]], []).append(obj)
        for kind, items in lists.items():
            (self.answers / f"{kind}.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List",
                                                                   "items": items}, indent=4))
        self.log = tmp / "kubectl.log"
        self.env = standin_env(tmp, self.answers, self.log)

    def audit(self, *args: str) -> tuple[int, dict[str, Any], str]:
        proc = subprocess.run([sys.executable, "-m", "kvmtune", "audit", "--no-images", "--format", "json", *args],
                              capture_output=True, text=True, timeout=120, env=self.env, check=False)
        return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else {}, proc.stderr

    def calls(self) -> list[list[str]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    return Cluster(tmp_path)


def test_a_cluster_is_read_kind_by_kind_and_audited(cluster: Cluster) -> None:
    _, doc, _ = cluster.audit("--kubevirt", "kind-kubevirt")
    guests = {f["target"]["domain"] for f in doc["findings"]}
    assert {"kubevirt:labs/testvm", "kubevirt:apps/legacy", "kubevirt:web/web1"} <= guests
    web1 = {f["rule"] for f in doc["findings"] if f["target"]["domain"] == "kubevirt:web/web1"}
    assert "KVM-STO-001" not in web1 and "KVM-STO-009" in web1  # the preference and instancetype, from the cluster
    calls = cluster.calls()
    assert len(calls) == 7 and all(c[:2] == ["--context", "kind-kubevirt"] and c[2] == "get" for c in calls)
    assert all(c[-3:] == ["--all-namespaces", "-o", "json"] for c in calls)  # read-only: get, nothing else
    text = json.dumps(doc)
    assert "virtualmachinepools.pool.kubevirt.io not served by this cluster" in text
    loc = next(f for f in doc["findings"] if f["rule"] == "KVM-NET-001")["extra"]["location"]
    assert loc["file"].startswith("kubectl://kind-kubevirt/") and "line" not in loc


def test_an_unknown_context_is_one_line_and_stops(cluster: Cluster) -> None:
    _, doc, _ = cluster.audit("--kubevirt", "nope")
    errors = [e for e in doc["errors"] if "kubectl --context nope get" in e]
    assert len(errors) == 1 and "does not exist" in errors[0]
    assert len(cluster.calls()) == 1


@pytest.mark.parametrize("context", ["--kubeconfig=/etc/shadow", "a b", "x\ny"])
def test_a_context_that_is_an_option_or_has_spaces_is_never_passed(cluster: Cluster, context: str) -> None:
    _, doc, err = cluster.audit(f"--kubevirt={context}")
    assert cluster.calls() == []
    assert "is not a kubeconfig context name" in json.dumps(doc) + err


def test_a_hostile_answer_is_refused_in_one_line(cluster: Cluster) -> None:
    vms = cluster.answers / "virtualmachines.kubevirt.io.json"
    vms.write_text('{"apiVersion": "v1", "kind": "List", "kind": "List", "items": []}')
    _, doc, _ = cluster.audit("--kubevirt", "kind-kubevirt")
    assert [e for e in doc["errors"] if "virtualmachines.kubevirt.io" in e and "duplicate key 'kind'" in e]
    assert "kubevirt:web/web1" not in {f["target"]["domain"] for f in doc["findings"]}
