"""``kvmtune fix --kubevirt [CONTEXT]``: ``kubectl patch --type merge`` per object, guarded by its resourceVersion,
journaled with the prior values and undone by the reverse patch. No real cluster and no ``kubectl`` this machine may
have is used: ``tests/fix/standins/kubectl.py`` is first on PATH and keeps the cluster's objects in list files, which
its ``patch`` changes as the API server would (merge patch, resourceVersion bump, Conflict, RestartRequired)."""

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
VMS = "virtualmachines.kubevirt.io"
ITYPES = "virtualmachineinstancetypes.instancetype.kubevirt.io"
KIND_OF = {"VirtualMachine": VMS, "VirtualMachineInstancetype": ITYPES,
           "VirtualMachineClusterPreference": "virtualmachineclusterpreferences.instancetype.kubevirt.io"}


class Cluster:
    """The fixture manifests as a cluster holds them: each with a resourceVersion; ``legacy`` runs (a VMI exists)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.answers = tmp / "answers"
        self.answers.mkdir()
        lists: dict[str, list[Any]] = {}
        for n, manifest in enumerate(sorted((FIX / "examples").glob("*.yaml")) + sorted((FIX / "tree").rglob("*.yaml"))):
            for doc in yaml.safe_load_all(manifest.read_text()):
                for i, obj in enumerate(doc["items"] if doc.get("kind") == "List" else [doc]):
                    obj["metadata"]["resourceVersion"] = str(1000 + 10 * n + i)
                    if obj["metadata"]["name"] == "legacy":
                        obj["status"] = {"created": True, "ready": True, "printableStatus": "Running",
                                         "conditions": [{"type": "Ready", "status": "True"}]}
                    lists.setdefault(KIND_OF[obj["kind"]], []).append(obj)
        for kind, items in lists.items():
            self.write(kind, items)
        self.log = tmp / "kubectl.log"
        self.journals = tmp / "journals"
        self.env = standin_env(tmp, self.answers, self.log)

    def write(self, kind: str, items: list[Any]) -> None:
        (self.answers / f"{kind}.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items},
                                                              indent=4))

    def items(self, kind: str = VMS) -> list[dict[str, Any]]:
        data: list[dict[str, Any]] = json.loads((self.answers / f"{kind}.json").read_text())["items"]
        return data

    def obj(self, name: str, kind: str = VMS) -> dict[str, Any]:
        return next(o for o in self.items(kind) if o["metadata"]["name"] == name)

    def kvmtune(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "kvmtune", *args], capture_output=True, text=True, timeout=120,
                              env={**self.env, **env}, check=False)

    def fix(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return self.kvmtune("fix", "--kubevirt", "kind-kubevirt", "--journal-dir", str(self.journals), *args, **env)

    def calls(self) -> list[list[str]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def patches(self) -> list[list[str]]:
        return [c for c in self.calls() if "patch" in c]

    def journal(self) -> dict[str, Any]:
        files = sorted(self.journals.glob("*.json"))
        assert len(files) == 1
        doc: dict[str, Any] = json.loads(files[0].read_text())
        return doc


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    return Cluster(tmp_path)


def test_the_plan_prints_each_patch_with_its_resource_version_and_changes_nothing(cluster: Cluster) -> None:
    before = json.loads((cluster.answers / f"{VMS}.json").read_text())
    proc = cluster.fix("--allow-bus-change")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    line = next(x for x in out.splitlines() if x.startswith("$ kubectl") and " legacy " in x)
    assert line.startswith(f"$ kubectl --context kind-kubevirt patch {VMS} legacy -n apps --type merge -p ")
    patch = json.loads(line.split(" -p ", 1)[1].strip("'"))
    assert patch["metadata"] == {"resourceVersion": cluster.obj("legacy")["metadata"]["resourceVersion"]}
    domain = patch["spec"]["template"]["spec"]["domain"]
    assert domain["ioThreadsPolicy"] == "auto" and domain["devices"]["blockMultiQueue"] is True
    assert domain["devices"]["disks"] == [{"name": "root", "disk": {"bus": "virtio"}}]  # a list goes whole
    # web1 takes its vCPUs from instancetype cmedium: ioThreadsPolicy is set there, and the plan says who shares it
    assert f"$ kubectl --context kind-kubevirt patch {ITYPES} cmedium -n web --type merge" in out
    assert "VirtualMachineInstancetype web/cmedium is used by kubevirt:web/web1: new revision: at the next restart" in out
    assert "#  takes effect: restart" in out
    assert json.loads((cluster.answers / f"{VMS}.json").read_text()) == before
    assert cluster.patches() == [] and all(c[2] == "get" for c in cluster.calls())


def test_apply_patches_journals_the_prior_values_reads_restart_required_and_undo_restores(cluster: Cluster) -> None:
    original = {o["metadata"]["name"]: o["spec"] for o in cluster.items()}
    original_it = cluster.obj("cmedium", ITYPES)["spec"]
    proc = cluster.fix("--allow-bus-change", "--apply", "--yes")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    legacy = cluster.obj("legacy")
    domain = legacy["spec"]["template"]["spec"]["domain"]
    assert domain["devices"]["disks"][0]["disk"]["bus"] == "virtio" and domain["ioThreadsPolicy"] == "auto"
    assert "KubeVirt VM apps/legacy: RestartRequired" in proc.stdout
    assert cluster.obj("cmedium", ITYPES)["spec"]["ioThreadsPolicy"] == "auto"
    entries = {e["name"]: e for e in cluster.journal()["changes"]}
    e = entries["legacy"]
    assert e["kind"] == "kubectl" and e["restart_required"] is True and e["takes_effect"] == "restart"
    rdomain = e["reverse"]["spec"]["template"]["spec"]["domain"]
    assert rdomain["ioThreadsPolicy"] is None and rdomain["devices"]["disks"] == [{"name": "root", "disk": {}}]
    assert entries["testvm"]["takes_effect"] == "live"  # Halted: no VMI, nothing staged; starts with it
    assert {p["takes_effect"] for p in entries["testvm"]["planned"]} == {"live"}
    items = [(p["rule"], p["target"], p["what"]) for p in e["planned"]]
    assert len(items) == len(set(items)) and {"KVM-STO-001", "KVM-STO-009", "KVM-NET-001"} <= {r for r, _, _ in items}
    assert all(e["status"] == "done" for e in entries.values())
    # every patch carried the resourceVersion read before it
    assert all('"resourceVersion"' in c[-1] for c in cluster.patches())
    status = cluster.kvmtune("fix", "--status", "--journal-dir", str(cluster.journals))
    assert "apps/legacy" in status.stdout or "legacy" in status.stdout
    assert "RestartRequired" in status.stdout and "virtctl restart legacy -n apps" in status.stdout
    assert "testvm" not in status.stdout.split("RestartRequired")[0].splitlines()[-1]
    # undo: the reverse merge patch, again guarded by the resourceVersion read just before
    jid = cluster.journal()["id"]
    undo = cluster.kvmtune("undo", "--journal-dir", str(cluster.journals), jid)
    assert undo.returncode == 0, undo.stderr + undo.stdout
    assert {o["metadata"]["name"]: o["spec"] for o in cluster.items()} == original
    assert cluster.obj("cmedium", ITYPES)["spec"] == original_it


def test_a_vm_changed_between_plan_and_apply_is_refused_and_nothing_is_patched(cluster: Cluster) -> None:
    proc = cluster.fix("--apply", "--yes", KVMTUNE_KUBECTL_RACE="get")
    assert proc.returncode != 0
    assert "changed since the plan was made (resourceVersion" in proc.stderr
    assert cluster.patches() == []


def test_the_api_servers_conflict_stops_the_apply_in_one_line(cluster: Cluster) -> None:
    before = {o["metadata"]["name"]: o["spec"] for o in cluster.items()}
    proc = cluster.fix("--apply", "--yes", KVMTUNE_KUBECTL_RACE="patch")
    assert proc.returncode != 0
    err = [x for x in proc.stderr.splitlines() if "Conflict" in x]
    assert len(err) == 1 and "changed since it was read" in err[0]
    assert len(cluster.patches()) == 1  # the first patch was refused; nothing after it ran
    assert {o["metadata"]["name"]: o["spec"] for o in cluster.items()} == before


@pytest.mark.parametrize(("lie", "said"), [
    ("kind", "the answer is another object (Pod"),
    ("name", "the answer is another object (VirtualMachine someone-else)"),
    ("no-rv", "the answer has no metadata.resourceVersion"),
    ("giant", "answer larger than 4 MiB; not read"),
])
def test_a_lying_kubectl_answer_is_refused_before_any_patch(cluster: Cluster, lie: str, said: str) -> None:
    proc = cluster.fix("--apply", "--yes", KVMTUNE_KUBECTL_LIE=lie)
    assert proc.returncode != 0
    assert said in proc.stderr, proc.stderr
    assert cluster.patches() == []
    assert not list(cluster.journals.glob("*.json")) or all(
        c["status"] != "done" for c in cluster.journal()["changes"])


def test_undo_leaves_a_vm_changed_after_the_patch_alone(cluster: Cluster) -> None:
    assert cluster.fix("--allow-bus-change", "--apply", "--yes").returncode == 0
    items = cluster.items()
    legacy = next(o for o in items if o["metadata"]["name"] == "legacy")
    legacy["spec"]["template"]["spec"]["domain"]["ioThreadsPolicy"] = "shared"  # someone else, since
    cluster.write(VMS, items)
    undo = cluster.kvmtune("undo", "--journal-dir", str(cluster.journals), cluster.journal()["id"])
    assert undo.returncode != 0
    assert "apps/legacy: changed after kvmtune patched it; not restored (--force)" in undo.stderr + undo.stdout
    assert cluster.obj("legacy")["spec"]["template"]["spec"]["domain"]["ioThreadsPolicy"] == "shared"


def test_hostile_names_and_missing_resource_versions_never_reach_kubectl(cluster: Cluster) -> None:
    items = cluster.items()
    legacy = next(o for o in items if o["metadata"]["name"] == "legacy")
    bad = json.loads(json.dumps(legacy))
    bad["metadata"]["name"] = "--kubeconfig=/tmp/x\u2028evil"
    norv = json.loads(json.dumps(legacy))
    norv["metadata"]["name"] = "norv"
    del norv["metadata"]["resourceVersion"]
    cluster.write(VMS, [*items, bad, norv])
    proc = cluster.fix("--allow-bus-change")
    assert proc.returncode == 0, proc.stderr
    assert "\u2028" not in proc.stdout + proc.stderr
    assert "is not a name kubectl is given" in proc.stdout
    assert "VirtualMachine apps/norv: kubectl's answer has no metadata.resourceVersion; not patched" in proc.stdout
    assert not any("--kubeconfig" in a for c in cluster.calls() for a in c)
    assert not any(" norv " in x for x in proc.stdout.splitlines() if x.startswith("$ kubectl"))


def test_a_journal_may_not_patch_anything_but_a_kubevirt_objects_spec(cluster: Cluster) -> None:
    assert cluster.fix("--apply", "--yes").returncode == 0
    path = next(cluster.journals.glob("*.json"))
    doc = json.loads(path.read_text())
    doc["changes"][0]["reverse"] = {"spec": {}, "metadata": {"labels": {"x": "y"}}}
    doc["changes"][0]["obj_kind"] = "Secret"
    path.write_text(json.dumps(doc))
    n = len(cluster.patches())
    undo = cluster.kvmtune("undo", "--journal-dir", str(cluster.journals), doc["id"])
    assert undo.returncode != 0
    text = undo.stderr + undo.stdout
    assert "'Secret' is not a kind kvmtune patches" in text and "changes more than the object's spec" in text
    assert len(cluster.patches()) == n


@pytest.mark.parametrize(("where", "value", "said"), [
    (["template", "spec", "volumes"], [{"name": "root", "hostDisk": {"path": "/etc/shadow", "type": "Disk"}}],
     "its reverse sets spec.template.spec.volumes, which kvmtune does not set"),
    (["runStrategy"], "Always", "its reverse sets spec.runStrategy, which kvmtune does not set"),
    (["template", "spec", "domain", "devices", "disks"], "extra disk",
     "its reverse replaces the list spec.template.spec.domain.devices.disks with one the other side does not match"),
    (["template", "spec", "domain", "devices", "disks"], "other name",
     "its reverse changes the items of spec.template.spec.domain.devices.disks in more than what kvmtune sets"),
])
def test_a_journal_may_only_put_back_what_kvmtune_sets(cluster: Cluster, where: list[str], value: Any,
                                                       said: str) -> None:
    """A journal's reverse patch (what undo sends) may hold only the fields kvmtune's KubeVirt forms set, and a list
    (a merge patch replaces it whole) only with the items the patch had, apart from those fields: as a ``qm`` entry
    may only put back the keys kvmtune sets. Before, any field of the spec passed (a hostDisk volume, runStrategy,
    another disk)."""
    assert cluster.fix("--apply", "--yes", "--allow-bus-change").returncode == 0
    path = next(cluster.journals.glob("*.json"))
    doc = json.loads(path.read_text())
    change = next(c for c in doc["changes"] if c["name"] == "legacy")
    node = change["reverse"]["spec"]
    for key in where[:-1]:
        node = node.setdefault(key, {})
    if value == "extra disk":
        node[where[-1]] = [*node[where[-1]], {"name": "stolen", "disk": {"bus": "virtio"}}]
    elif value == "other name":
        node[where[-1]] = [{**node[where[-1]][0], "name": "stolen"}, *node[where[-1]][1:]]
    else:
        node[where[-1]] = value
    path.write_text(json.dumps(doc))
    n = len(cluster.patches())
    undo = cluster.kvmtune("undo", "--journal-dir", str(cluster.journals), doc["id"])
    assert undo.returncode != 0
    assert said in undo.stderr + undo.stdout
    assert len(cluster.patches()) == n


def test_what_kvmtune_itself_patches_passes_the_journal_check() -> None:
    """The forward and reverse patches of a disk bus (a disk's, a lun's, a cdrom's), a NIC model and a mapping value
    are what kvmtune sets: a journal holding them is accepted."""
    from kvmtune.fix.kubectl_paths import patch_refusals

    def vm(disks: list[Any], nics: list[Any], **domain: Any) -> dict[str, Any]:
        return {"spec": {"template": {"spec": {"domain": {"devices": {"disks": disks, "interfaces": nics}, **domain}}}}}

    before = vm([{"name": "a", "disk": {}}, {"name": "b", "cdrom": {"bus": "sata"}}, {"name": "c", "lun": {}}],
                [{"name": "n", "model": "e1000e", "masquerade": {}}])
    after = vm([{"name": "a", "disk": {"bus": "virtio"}}, {"name": "b", "cdrom": {"bus": "scsi"}},
                {"name": "c", "lun": {"bus": "scsi"}}], [{"name": "n", "model": "virtio", "masquerade": {}}],
               ioThreadsPolicy="auto", features={"hyperv": {"relaxed": {}, "spinlocks": {"spinlocks": 8191}}})
    assert patch_refusals("VirtualMachine", after, before) == []
    assert patch_refusals("VirtualMachineInstancetype", {"spec": {"ioThreadsPolicy": "auto"}},
                          {"spec": {"ioThreadsPolicy": None}}) == []
    assert patch_refusals("VirtualMachineInstancetype", {"spec": {"memory": {"guest": "1Gi"}}},
                          {"spec": {"memory": {"guest": "2Gi"}}}) != []
