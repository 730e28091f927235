"""A running VMI's effective domain XML, read through its virt-launcher pod (``audit --kubevirt``), read-only.

What KubeVirt documents and does (kubevirt/user-guide ``docs/debug_virt_stack/virsh-commands.md``: "``virsh`` ... is
already installed in the ``compute`` container on the virt-launcher pod", its domain listed as ``default_vmi-…``;
kubevirt/kubevirt ``pkg/virt-controller/services/template.go``: the pod is named ``virt-launcher-<vmi>-<random>`` and
labelled ``kubevirt.io/created-by: <the VMI's uid>``, its controller the VMI, so in the VMI's namespace;
``pkg/virt-launcher/virtwrap/util/libvirt_helper.go``: the libvirt domain is ``<namespace>_<name>``):

1. ``kubectl [--context C] get pods -n NS -l kubevirt.io/created-by=UID -o json``: the VMI's pods; the one kept is
   in NS, carries that label, runs, has a ``compute`` container, is among the VMI's ``status.activePods`` (when the
   VMI lists them) and, during a migration, is the one on the VMI's ``status.nodeName``;
2. ``kubectl [--context C] exec -n NS POD -c compute -- virsh dumpxml NS_NAME``: its XML.

Everything the cluster says is hostile: a namespace must be a DNS-1123 label, a VMI and a pod name a DNS-1123
subdomain (so no ``-`` first, no separator, space or line break) and a uid a UUID before any of them is put on a
command line; the pod list is at most :data:`MAX_PODS_BYTES` and read by the manifest reader (duplicate keys, tags
refused); the XML at most :data:`MAX_XML_BYTES`, and an answer whose bytes were not UTF-8 is refused (the runner
decodes with replacement characters). The XML itself is parsed by the caller with the domain reader's safe parser
(no DTD, no entity) and its ``<name>`` held to ``NS_NAME``: kubevirt/ reads no XML (docs/architecture.md §2).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from kvmtune.errors import InputError
from kvmtune.kubevirt.kubectl import KUBECTL, TIMEOUT_S, origin, valid_context
from kvmtune.kubevirt.load import KObject
from kvmtune.runner import Runner

MAX_PODS_BYTES = 8 * 1024 * 1024
MAX_XML_BYTES = 16 * 1024 * 1024  # as domain/xml.py's MAX_XML_BYTES: the most of a domain kvmtune reads
COMPUTE = "compute"  # the virt-launcher container virsh is in
CREATED_BY = "kubevirt.io/created-by"  # the pod label whose value is the VMI's uid
_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")  # RFC 1123 label: a namespace
_SUBDOMAIN = re.compile(r"(?=.{1,253}\Z)[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*")
_STOP = re.compile(r"forbidden|context .* does not exist|Unauthorized", re.I)  # every other call fails alike
_TERMINATED = re.compile(r"command terminated with exit code \d+")  # kubectl's line after the command's own
_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def valid_namespace(name: object) -> bool:
    return isinstance(name, str) and _LABEL.fullmatch(name) is not None


def valid_name(name: object) -> bool:
    """A VMI's or pod's name as Kubernetes allows it (DNS-1123 subdomain): nothing else reaches a command line."""
    return isinstance(name, str) and _SUBDOMAIN.fullmatch(name) is not None


def domain_name(namespace: str, name: str) -> str:
    """The libvirt domain virt-launcher defines for a VMI (``VMINamespaceKeyFunc``)."""
    return f"{namespace}_{name}"


@dataclass(frozen=True)
class RunningVmi:
    vmi: KObject
    namespace: str
    name: str
    uid: str
    node: str | None
    active_pods: frozenset[str] | None  # status.activePods' pod uids; None: the VMI lists none

    @property
    def domain(self) -> str:
        return domain_name(self.namespace, self.name)


@dataclass(frozen=True)
class LauncherXml:
    running: RunningVmi
    pod: str
    xml: str
    where: str  # kubectl://CONTEXT/NS/POD#NS_NAME


@dataclass
class Launched:
    found: list[LauncherXml] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def running_vmis(objects: list[KObject]) -> tuple[list[RunningVmi], list[str]]:
    """The VMIs among ``objects`` whose ``status.phase`` is ``Running``, each checked for a command line; a VMI
    whose namespace, name or uid is not one Kubernetes would give is said in one line and not asked about."""
    out: list[RunningVmi] = []
    notes: list[str] = []
    for obj in objects:
        if obj.kind != "VirtualMachineInstance":
            continue
        status = obj.body.get("status")
        status = status if isinstance(status, dict) else {}
        if status.get("phase") != "Running":
            continue
        ns = obj.namespace or "default"
        meta = obj.body.get("metadata")
        uid = meta.get("uid") if isinstance(meta, dict) else None
        shown = f"VMI {ns!r}/{obj.name!r}"
        if not valid_namespace(ns) or not valid_name(obj.name):
            notes.append(f"{shown}: not a Kubernetes namespace and name; its virt-launcher is not asked")
            continue
        if not isinstance(uid, str) or not _UID.fullmatch(uid):
            notes.append(f"{shown}: no metadata.uid of a UUID's form; its virt-launcher pod cannot be found")
            continue
        node = status.get("nodeName")
        pods = status.get("activePods")
        active = frozenset(str(k) for k in pods) if isinstance(pods, dict) and pods else None
        out.append(RunningVmi(obj, ns, obj.name, uid, node if isinstance(node, str) else None, active))
    return out, notes


def _context(context: str | None) -> list[str]:
    if context is not None and not valid_context(context):
        raise InputError("--kubevirt", f"{context!r} is not a kubeconfig context name kvmtune passes to kubectl")
    return ["--context", context] if context else []


def pods_argv(vmi: RunningVmi, context: str | None) -> list[str]:
    return [KUBECTL, *_context(context), "get", "pods", "-n", vmi.namespace, "-l", f"{CREATED_BY}={vmi.uid}",
            "-o", "json"]


def exec_argv(vmi: RunningVmi, pod: str, context: str | None) -> list[str]:
    if not valid_name(pod):
        raise InputError(origin(context), f"pod name {pod!r} is not a Kubernetes name; not passed to kubectl")
    return [KUBECTL, *_context(context), "exec", "-n", vmi.namespace, pod, "-c", COMPUTE, "--", "virsh", "dumpxml",
            vmi.domain]


def _str(d: Any, *keys: str) -> Any:
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def choose_pod(vmi: RunningVmi, items: list[Any], where: str) -> str:
    """The VMI's running virt-launcher pod among ``items`` (kubectl's answer); :class:`InputError` names why none."""
    refused: list[str] = []
    kept: list[tuple[str, Any]] = []
    for item in items:
        name = _str(item, "metadata", "name")
        if not valid_name(name):
            refused.append(f"a pod named {name!r} (not a Kubernetes name)")
            continue
        if _str(item, "metadata", "namespace") != vmi.namespace:
            refused.append(f"pod {name} in namespace {_str(item, 'metadata', 'namespace')!r}, not {vmi.namespace}")
            continue
        if _str(item, "metadata", "labels", CREATED_BY) != vmi.uid:
            refused.append(f"pod {name} not labelled {CREATED_BY}={vmi.uid}")
            continue
        if vmi.active_pods is not None and _str(item, "metadata", "uid") not in vmi.active_pods:
            refused.append(f"pod {name} not among the VMI's status.activePods")
            continue
        containers = _str(item, "spec", "containers")
        if not any(_str(c, "name") == COMPUTE for c in containers if isinstance(containers, list)):
            refused.append(f"pod {name} has no {COMPUTE} container")
            continue
        if _str(item, "status", "phase") != "Running":
            continue  # a finished source pod of a migration, one still starting: not the VMI's domain now
        kept.append((name, item))
    if len(kept) > 1 and vmi.node is not None:  # a migration: source and target run, the VMI names its node
        kept = [k for k in kept if _str(k[1], "spec", "nodeName") == vmi.node] or kept
    if len(kept) == 1:
        return kept[0][0]
    if kept:
        raise InputError(where, f"{len(kept)} running virt-launcher pods ({', '.join(k[0] for k in kept)}) and none "
                         "on the VMI's status.nodeName; not read")
    why = f" ({'; '.join(refused[:3])}{'; …' if len(refused) > 3 else ''})" if refused else ""
    raise InputError(where, f"no running virt-launcher pod{why}")


def find_pod(runner: Runner, context: str | None, vmi: RunningVmi) -> str:
    from kvmtune.kubevirt.yamldoc import load_documents

    argv = pods_argv(vmi, context)
    where = f"{origin(context)}/{vmi.namespace}/{vmi.name}"
    result = runner.run(argv, timeout=TIMEOUT_S, max_output=MAX_PODS_BYTES)
    if result.too_large:
        raise InputError(where, f"the pod list is larger than {MAX_PODS_BYTES // (1024 * 1024)} MiB; not read")
    if not result.ok:
        raise InputError(where, f"{' '.join(argv)}: {result.describe_failure()}")
    docs = load_documents(f"{where} (kubectl get pods)", result.stdout)
    data = docs[0].data if len(docs) == 1 else None
    items = data.get("items") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise InputError(where, "kubectl get pods did not answer a List of pods")
    return choose_pod(vmi, items, where)


def dumpxml(runner: Runner, context: str | None, vmi: RunningVmi, pod: str) -> LauncherXml:
    argv = exec_argv(vmi, pod, context)
    where = f"{origin(context)}/{vmi.namespace}/{pod}#{vmi.domain}"
    result = runner.run(argv, timeout=TIMEOUT_S, max_output=MAX_XML_BYTES)  # the tenant's pod writes it: bounded
    if result.too_large:
        raise InputError(where, f"virsh dumpxml answered more than {MAX_XML_BYTES // (1024 * 1024)} MiB; refused "
                         "(kubectl stopped)")
    if not result.ok:
        said = [ln.strip() for ln in result.stderr.splitlines() if ln.strip() and not _TERMINATED.match(ln.strip())]
        why = (f"exited {result.returncode}: {said[-1][:300]}" if said and not result.timed_out and result.returncode != 127
               else result.describe_failure())
        raise InputError(where, f"virsh dumpxml in the compute container: {why}")
    if "\ufffd" in result.stdout:
        raise InputError(where, "virsh dumpxml answered bytes that are not UTF-8; refused")
    return LauncherXml(vmi, pod, result.stdout, where)


def read_running(runner: Runner, context: str | None, objects: list[KObject]) -> Launched:
    """The effective domain XML of every running VMI among ``objects``; one line for each that could not be read."""
    out = Launched()
    vmis, out.notes = running_vmis(objects)
    for i, vmi in enumerate(vmis):
        try:
            out.found.append(dumpxml(runner, context, vmi, find_pod(runner, context, vmi)))
        except InputError as exc:
            out.errors.append(str(exc))
            last = runner.history[-1] if runner.history else None
            if (last is not None and not last.ok and (last.returncode == 127 or _STOP.search(last.stderr))
                    and i + 1 < len(vmis)):
                out.errors.append(f"{origin(context)}: the other {len(vmis) - i - 1} running VMI(s) not asked (the "
                                  "same answer would come)")
                break
    return out
