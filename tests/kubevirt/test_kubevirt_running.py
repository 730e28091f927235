"""``kvmtune audit --kubevirt`` reads each running VMI's effective domain XML through its virt-launcher pod (``kubectl
get pods`` by the ``kubevirt.io/created-by`` label, then ``kubectl exec … -c compute -- virsh dumpxml NS_NAME``),
audits it with the domain rules and maps each finding back to the spec field that causes it.

No real cluster and no ``kubectl`` this machine may have is used: ``tests/fix/standins/kubectl.py`` is first on PATH
and answers from ``tests/kubevirt/fixtures/examples`` (the VMs) and ``tests/kubevirt/launcher`` (their VMIs, pods and
``virsh dumpxml`` answers). Everything the cluster says is hostile: the hostile cases rewrite those answers."""

from __future__ import annotations

import json
import shutil
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
EXAMPLES = HERE / "fixtures" / "examples"
TUNED = HERE / "fixtures" / "tuned"
LAUNCHER = HERE / "launcher"
VMS = "virtualmachines.kubevirt.io"
VMIS = "virtualmachineinstances.kubevirt.io"
TESTVM_POD = "virt-launcher-testvm-x7k2p"
TESTVM_XML = f"dumpxml/{TESTVM_POD}/labs_testvm.xml"
TESTVM_UID = "8b5c2d4e-7f0a-4c1b-9e3d-2a6f8c0b1d5e"


class Cluster:
    def __init__(self, tmp: Path) -> None:
        self.answers = tmp / "answers"
        shutil.copytree(LAUNCHER, self.answers)
        vms = [obj for manifest in sorted([*EXAMPLES.glob("*.yaml"), *TUNED.glob("*.yaml")])
               for obj in yaml.safe_load_all(manifest.read_text())]
        self.write(f"{VMS}.json", {"apiVersion": "v1", "kind": "List", "items": vms})
        shutil.copy(LAUNCHER / "vmis.json", self.answers / f"{VMIS}.json")
        self.log = tmp / "kubectl.log"
        self.env = standin_env(tmp, self.answers, self.log)

    def write(self, name: str, data: Any) -> None:
        (self.answers / name).write_text(json.dumps(data, indent=4))

    def vmis(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.answers / f"{VMIS}.json").read_text())
        return data

    def audit(self) -> tuple[int, dict[str, Any], str]:
        proc = subprocess.run([sys.executable, "-m", "kvmtune", "audit", "--no-images", "--format", "json",
                               "--kubevirt", "kind-kubevirt"],
                              capture_output=True, text=True, timeout=120, env=self.env, check=False)
        return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else {}, proc.stderr

    def calls(self) -> list[list[str]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def execs(self) -> list[list[str]]:
        return [c for c in self.calls() if "exec" in c]


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    return Cluster(tmp_path)


def findings_of(doc: dict[str, Any], guest: str) -> dict[str, dict[str, Any]]:
    return {f["rule"]: f for f in doc["findings"] if f["target"]["domain"] == guest}


def test_a_running_vmis_domain_is_audited_and_mapped_to_the_vm_spec(cluster: Cluster) -> None:
    code, doc, err = cluster.audit()
    assert code == 0, (doc.get("errors"), err)
    legacy = findings_of(doc, "kubevirt:apps/legacy (running)")
    bus = legacy["KVM-STO-001"]
    assert bus["evidence"] == "/domain/devices/disk[1]/target/@bus"  # where it was read: the effective XML
    loc = bus["extra"]["location"]
    assert loc["path"] == "spec.template.spec.domain.devices.disks[0].disk.bus"  # the VM's field (ua-root)
    assert loc["file"] == f"kubectl://kind-kubevirt/{VMS}" and loc["spec_of"] == "kubevirt:apps/legacy"
    assert loc["domain_xml"] == "kubectl://kind-kubevirt/apps/virt-launcher-legacy-9qzfd#apps_legacy"
    assert bus["fix"]["description"].startswith("KubeVirt: set spec.template.spec.domain.devices.disks[0].disk.bus: "
                                                "virtio")
    assert legacy["KVM-NET-001"]["extra"]["location"]["path"] == "spec.template.spec.domain.devices.interfaces[0].model"
    # KubeVirt chooses io itself (native for block volumes and preallocated images): no spec field to name, said so
    aio = legacy["KVM-STO-006"]
    assert aio["extra"]["location"]["path"] is None
    assert aio["fix"]["description"].startswith("no KubeVirt spec field is known to cause this")
    testvm = findings_of(doc, "kubevirt:labs/testvm (running)")
    assert testvm["KVM-STO-009"]["extra"]["location"]["path"] == "spec.template.spec.domain.ioThreadsPolicy"
    assert (testvm["KVM-NET-008"]["extra"]["location"]["path"]
            == "spec.template.spec.domain.devices.networkInterfaceMultiqueue")
    # the VMIs are their VMs' running instances: no second spec guest of the same name
    spec_guest = [f for f in doc["findings"] if f["target"]["domain"] == "kubevirt:labs/testvm"]
    assert len(spec_guest) == len({(f["rule"], f["target"].get("device")) for f in spec_guest})
    assert "the VirtualMachineInstance of VirtualMachine testvm" in json.dumps(doc)
    # read-only: get (kinds, then pods by the created-by label) and exec of virsh dumpxml, nothing else
    calls = cluster.calls()
    assert {c[2] for c in calls} == {"get", "exec"}
    assert ["--context", "kind-kubevirt", "get", "pods", "-n", "labs", "-l", f"kubevirt.io/created-by={TESTVM_UID}",
            "-o", "json"] in calls
    assert sorted(cluster.execs()) == [
        ["--context", "kind-kubevirt", "exec", "-n", "apps", "virt-launcher-legacy-9qzfd", "-c", "compute", "--",
         "virsh", "dumpxml", "apps_legacy"],
        ["--context", "kind-kubevirt", "exec", "-n", "labs", TESTVM_POD, "-c", "compute", "--", "virsh", "dumpxml",
         "labs_testvm"],
        ["--context", "kind-kubevirt", "exec", "-n", "prod", "virt-launcher-db-m4t8c", "-c", "compute", "--", "virsh",
         "dumpxml", "prod_db"]]
    # the fully tuned VM: nothing above info, neither in its spec nor in the domain it runs as
    for name in ("kubevirt:prod/db", "kubevirt:prod/db (running)"):
        assert [f["rule"] for f in doc["findings"] if f["target"]["domain"] == name and f["severity"] != "info"] == []
    assert any(f["target"]["domain"] == "kubevirt:prod/db (running)" for f in doc["findings"])  # it was audited


def test_a_vmi_that_does_not_run_is_not_asked(cluster: Cluster) -> None:
    vmis = cluster.vmis()
    vmis["items"][0]["status"]["phase"] = "Scheduling"
    cluster.write(f"{VMIS}.json", vmis)
    _, doc, _ = cluster.audit()
    assert [c for c in cluster.execs() if "labs" in c] == []
    assert "kubevirt:labs/testvm (running)" not in {f["target"]["domain"] for f in doc["findings"]}


def _refused(cluster: Cluster, text: str) -> dict[str, Any]:
    code, doc, _ = cluster.audit()
    errors = [e for e in doc["errors"] if text in e]
    assert code == 2 and len(errors) == 1, doc["errors"]
    assert "\n" not in errors[0]
    guests = {f["target"]["domain"] for f in doc["findings"]}
    assert "kubevirt:labs/testvm (running)" not in guests
    assert "kubevirt:apps/legacy (running)" in guests  # one VMI's bad answer spoils no other
    return doc


@pytest.mark.parametrize(("answer", "said"), [
    (b'<domain type="kvm"><name>labs_other</name></domain>', "virsh answered the domain 'labs_other', not labs_testvm"),
    (b'<domain type="kvm"><name>labs_testvm</name><metadata><kubevirt xmlns="http://kubevirt.io"><uid>'
     b'0c9b8a7d-6e5f-4d3c-2b1a-0f9e8d7c6b5a</uid></kubevirt></metadata></domain>',
     "metadata names the VMI uid '0c9b8a7d-6e5f-4d3c-2b1a-0f9e8d7c6b5a', not " + TESTVM_UID),
    (b'<?xml version="1.0"?>\n<!DOCTYPE d [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;">]>\n'
     b'<domain type="kvm"><name>labs_testvm</name><description>&b;</description></domain>',
     "DOCTYPE/ENTITY declarations are refused"),
    (b'<domain type="kvm"><name>labs_testvm\xff\xfe</name></domain>', "answered bytes that are not UTF-8"),
    (b'<domain type="kvm"><name>labs_testvm</name>' + b"<description>" + b"x" * (17 * 1024 * 1024)
     + b"</description></domain>", "virsh dumpxml answered more than 16 MiB; refused"),
    (b'<domain type="kvm"><name>labs_testvm</name>', "malformed XML"),
    (b"", "empty file"),
    (b'<network><name>labs_testvm</name></network>', "not a libvirt domain"),
])
def test_an_exec_answer_that_lies_is_refused_in_one_line(cluster: Cluster, answer: bytes, said: str) -> None:
    (cluster.answers / TESTVM_XML).write_bytes(answer)
    _refused(cluster, said)


def test_a_domain_the_pod_does_not_have_is_one_line(cluster: Cluster) -> None:
    (cluster.answers / TESTVM_XML).unlink()
    doc = _refused(cluster, "failed to get domain 'labs_testvm'")
    assert any(e.startswith(f"kubectl://kind-kubevirt/labs/{TESTVM_POD}#labs_testvm:") for e in doc["errors"])


def _pod(name: Any, namespace: Any = "labs", uid: str = "6a1d2c3b-4e5f-4a6b-8c7d-9e0f1a2b3c4d") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": uid,
                         "labels": {"kubevirt.io/created-by": TESTVM_UID}},
            "spec": {"nodeName": "node01", "containers": [{"name": "compute"}]}, "status": {"phase": "Running"}}


@pytest.mark.parametrize(("pod", "said"), [
    (_pod("-virt-launcher-testvm"), "a pod named '-virt-launcher-testvm' (not a Kubernetes name)"),
    (_pod("--context=prod"), "(not a Kubernetes name)"),
    (_pod("virt-launcher testvm"), "(not a Kubernetes name)"),
    (_pod("virt-launcher\ntestvm"), "(not a Kubernetes name)"),
    (_pod("virt-launcher;testvm"), "(not a Kubernetes name)"),
    (_pod("../testvm"), "(not a Kubernetes name)"),
    (_pod(["virt-launcher"]), "(not a Kubernetes name)"),
    (_pod(TESTVM_POD, "kube-system"), f"pod {TESTVM_POD} in namespace 'kube-system', not labs"),
    (_pod(TESTVM_POD, uid="11111111-2222-4333-8444-555555555555"), "not among the VMI's status.activePods"),
])
def test_a_pod_list_that_lies_is_never_put_on_a_command_line(cluster: Cluster, pod: dict[str, Any], said: str) -> None:
    cluster.write("pods.labs.json", {"apiVersion": "v1", "kind": "List", "items": [pod]})
    doc = _refused(cluster, said)
    assert [c for c in cluster.execs() if "labs" in c] == []
    assert any("no running virt-launcher pod" in e for e in doc["errors"])


def test_a_pod_list_with_duplicate_keys_is_refused(cluster: Cluster) -> None:
    (cluster.answers / "pods.labs.json").write_text('{"apiVersion": "v1", "kind": "List", "kind": "List", "items": []}')
    _refused(cluster, "duplicate key 'kind'")
    assert [c for c in cluster.execs() if "labs" in c] == []


@pytest.mark.parametrize(("field", "value"), [
    ("namespace", "-n"), ("namespace", "labs\nkube-system"), ("namespace", "labs\u2028x"), ("name", "test\u0085vm"),
    ("namespace", "kube_system"), ("namespace", "a" * 64),
    ("name", "--context=prod"), ("name", "test vm"), ("name", "testvm\n"), ("name", "Testvm"),
    ("uid", "x -o yaml"), ("uid", "8B5C2D4E-7F0A-4C1B-9E3D-2A6F8C0B1D5E\n"), ("uid", None),
])
def test_a_vmi_whose_names_are_not_kubernetes_names_is_not_asked(cluster: Cluster, field: str, value: Any) -> None:
    vmis = cluster.vmis()
    vmis["items"][0]["metadata"][field] = value
    vmis["items"][0]["metadata"]["ownerReferences"] = []  # its own guest then: no VM of that name to belong to
    cluster.write(f"{VMIS}.json", vmis)
    _, doc, _ = cluster.audit()
    shown = json.dumps(doc)
    assert "not a Kubernetes namespace and name" in shown or "no metadata.uid of a UUID's form" in shown
    asked = [c[5] for c in cluster.calls() if c[:5] == ["--context", "kind-kubevirt", "get", "pods", "-n"]]
    assert sorted(asked) == ["apps", "prod"]  # the other running VMIs only
    assert sorted(c[4] for c in cluster.execs()) == ["apps", "prod"]
    assert "kubevirt:apps/legacy (running)" in {f["target"]["domain"] for f in doc["findings"]}


def test_a_migration_reads_the_pod_on_the_vmis_node(cluster: Cluster) -> None:
    source = _pod("virt-launcher-testvm-old01", uid="11111111-2222-4333-8444-555555555555")
    source["spec"]["nodeName"] = "node03"
    target = _pod(TESTVM_POD)
    vmis = cluster.vmis()
    vmis["items"][0]["status"]["activePods"] = {"11111111-2222-4333-8444-555555555555": "node03",
                                                "6a1d2c3b-4e5f-4a6b-8c7d-9e0f1a2b3c4d": "node01"}
    cluster.write(f"{VMIS}.json", vmis)
    cluster.write("pods.labs.json", {"apiVersion": "v1", "kind": "List", "items": [source, target]})
    _, doc, _ = cluster.audit()
    assert [c[5] for c in cluster.execs() if "labs" in c] == [TESTVM_POD]
    assert "kubevirt:labs/testvm (running)" in {f["target"]["domain"] for f in doc["findings"]}


def test_a_vmi_without_a_vm_maps_to_its_own_spec(cluster: Cluster) -> None:
    vms = json.loads((cluster.answers / f"{VMS}.json").read_text())
    vms["items"] = [v for v in vms["items"] if v["metadata"]["name"] != "testvm"]
    cluster.write(f"{VMS}.json", vms)
    _, doc, _ = cluster.audit()
    loc = findings_of(doc, "kubevirt:labs/testvm (running)")["KVM-STO-009"]["extra"]["location"]
    assert loc["path"] == "spec.domain.ioThreadsPolicy" and loc["file"] == f"kubectl://kind-kubevirt/{VMIS}"


@pytest.mark.parametrize(("alias", "said"), [
    ('<alias name="ua-swap"></alias>', "is 'swap', which has no entry in spec.template.spec.domain.devices.disks"),
    ("", "carries no KubeVirt alias (ua-NAME): which spec entry made it is not known"),
])
def test_a_device_the_spec_does_not_name_is_said_to_have_no_field(cluster: Cluster, alias: str, said: str) -> None:
    xml = cluster.answers / "dumpxml" / "virt-launcher-legacy-9qzfd" / "apps_legacy.xml"
    xml.write_text(xml.read_text().replace('<alias name="ua-root"></alias>', alias))
    _, doc, _ = cluster.audit()
    bus = findings_of(doc, "kubevirt:apps/legacy (running)")["KVM-STO-001"]
    assert bus["extra"]["location"]["path"] is None
    assert bus["fix"]["description"].startswith("no spec field can be named: ") and said in bus["fix"]["description"]


def test_a_vmi_claiming_another_vm_as_its_controller_stays_a_guest_of_its_own(cluster: Cluster) -> None:
    vmis = cluster.vmis()
    vmis["items"][0]["metadata"]["ownerReferences"][0]["name"] = "legacy"  # the VM of that name is in apps, not labs
    vmis["items"][1]["metadata"]["ownerReferences"][0]["name"] = "testvm"  # a VM of another name in its namespace
    cluster.write(f"{VMIS}.json", vmis)
    _, doc, _ = cluster.audit()
    assert "the VirtualMachineInstance of VirtualMachine" not in json.dumps(doc).replace("VirtualMachine db", "")
    loc = findings_of(doc, "kubevirt:apps/legacy (running)")["KVM-STO-001"]["extra"]["location"]
    assert loc["file"] == f"kubectl://kind-kubevirt/{VMIS}" and loc["path"] == "spec.domain.devices.disks[0].disk.bus"
