"""kubevirt/launcher.py's choices, on kubectl answers given to it directly: which pod is the VMI's, what stops the
asking. The whole path through the ``kubectl`` stand-in is ``test_kubevirt_running.py``'s."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from kvmtune.errors import InputError
from kvmtune.kubevirt.launcher import choose_pod, read_running, running_vmis, valid_name, valid_namespace
from kvmtune.kubevirt.load import read_file
from kvmtune.runner import CommandResult, Runner

VMIS = Path(__file__).parent / "launcher" / "vmis.json"


def vmis() -> list[Any]:
    return running_vmis(read_file(str(VMIS)))[0]


def pod(name: str, **over: Any) -> dict[str, Any]:
    vmi = vmis()[0]
    item: dict[str, Any] = {
        "metadata": {"name": name, "namespace": vmi.namespace, "uid": next(iter(vmi.active_pods)),
                     "labels": {"kubevirt.io/created-by": vmi.uid}},
        "spec": {"nodeName": vmi.node, "containers": [{"name": "compute"}]}, "status": {"phase": "Running"}}
    item.update(over)  # a whole part replaced
    return item


@pytest.mark.parametrize("name", ["virt-launcher-testvm-x7k2p", "a", "a.b-c", "x" * 253])
def test_kubernetes_names_pass(name: str) -> None:
    assert valid_name(name)


@pytest.mark.parametrize("name", ["", "-a", "a-", "A", "a_b", "a b", "a\nb", "a\tb", "a/b", "..", "a..b", "x" * 254,
                                  "a\u2028b", "ä", "--context=x", None, 3, ["a"]])
def test_other_names_do_not(name: Any) -> None:
    assert not valid_name(name)
    assert not valid_namespace(name)


def test_only_a_running_pod_with_a_compute_container_is_the_vmis() -> None:
    vmi = vmis()[0]
    assert choose_pod(vmi, [pod("old", status={"phase": "Succeeded"}), pod("new")], "w") == "new"
    with pytest.raises(InputError, match="has no compute container"):
        choose_pod(vmi, [pod("p", spec={"nodeName": vmi.node, "containers": [{"name": "sidecar"}]})], "w")
    with pytest.raises(InputError, match=r"no running virt-launcher pod$"):
        choose_pod(vmi, [pod("p", status={"phase": "Pending"})], "w")
    with pytest.raises(InputError, match="2 running virt-launcher pods"):
        choose_pod(vmi, [pod("p", spec={"nodeName": "x", "containers": [{"name": "compute"}]}),
                         pod("q", spec={"nodeName": "y", "containers": [{"name": "compute"}]})], "w")


class Answers(Runner):
    """A runner whose kubectl answers are given: every ``get pods`` the VMI's pod, every ``exec`` ``denied``."""

    def __init__(self, denied: str, code: int = 1) -> None:
        super().__init__()
        self.denied, self.code = denied, code

    def run(self, argv: Sequence[str], **_: Any) -> CommandResult:
        if "exec" in argv:
            result = CommandResult(tuple(argv), self.code, "", self.denied, 0.1)
        else:
            ns = argv[argv.index("-n") + 1]
            vmi = next(v for v in vmis() if v.namespace == ns)
            item = {"metadata": {"name": f"virt-launcher-{vmi.name}-abcde", "namespace": ns,
                                 "uid": next(iter(vmi.active_pods)), "labels": {"kubevirt.io/created-by": vmi.uid}},
                    "spec": {"nodeName": vmi.node, "containers": [{"name": "compute"}]}, "status": {"phase": "Running"}}
            result = CommandResult(tuple(argv), 0, json.dumps({"kind": "List", "items": [item]}), "", 0.1)
        self.history.append(result)
        return result


@pytest.mark.parametrize(("denied", "code"), [
    ('Error from server (Forbidden): pods "x" is forbidden: User "dev" cannot create resource "pods/exec"', 1),
    ("kubectl: not found", 127),
])
def test_an_exec_every_vmi_would_be_refused_stops_the_asking(denied: str, code: int) -> None:
    runner = Answers(denied, code)
    launched = read_running(runner, "kind-kubevirt", read_file(str(VMIS)))
    assert sum(1 for r in runner.history if "exec" in r.argv) == 1
    assert len(launched.errors) == 2 and "not asked" in launched.errors[1]


def test_a_domain_one_pod_lacks_does_not_stop_the_others() -> None:
    runner = Answers("error: failed to get domain 'x'\ncommand terminated with exit code 1")
    launched = read_running(runner, None, read_file(str(VMIS)))
    assert sum(1 for r in runner.history if "exec" in r.argv) == len(vmis()) == len(launched.errors)
    assert all(e.endswith("exited 1: error: failed to get domain 'x'") for e in launched.errors)
