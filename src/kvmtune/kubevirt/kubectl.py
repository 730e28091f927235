"""KubeVirt objects from a cluster: ``kubectl [--context C] get KIND --all-namespaces -o json``, one call per kind,
through the one :class:`~kvmtune.runner.Runner`. Reading is read-only; the one write, ``kubectl patch --type merge``
(:func:`patch_argv`, :func:`run_patch`), is run only by ``fix/kubevirt.py`` from a confirmed plan.

One object is read back with ``kubectl get RESOURCE NAME [-n NS] -o json`` (:func:`get_object`) and checked: at most
:data:`MAX_OBJECT_BYTES`, read as any manifest is, the kind, name and namespace asked for, a
``metadata.resourceVersion`` (a patch is guarded by it). Names go into argv only as Kubernetes writes them
(:func:`valid_name`: DNS-1123, never an option).

What kubectl prints is hostile like any manifest: at most :data:`MAX_JSON_BYTES`, read by the same reader as files
(``yamldoc``: duplicate keys, tags, alias bombs refused), a ``kind: List`` of objects. A kind the cluster does not
serve (no pool CRD, an older KubeVirt without instancetypes) is said in one line and the others are read; a failing
kubectl (no such context, no access) is one line naming the command.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from kvmtune.errors import InputError, KvmtuneError
from kvmtune.kubevirt.load import KObject, Read, objects_of
from kvmtune.runner import Runner

KUBECTL = "kubectl"
TIMEOUT_S = 60.0
MAX_JSON_BYTES = 64 * 1024 * 1024
KINDS = (
    "virtualmachines.kubevirt.io",
    "virtualmachineinstances.kubevirt.io",
    "virtualmachinepools.pool.kubevirt.io",
    "virtualmachineinstancetypes.instancetype.kubevirt.io",
    "virtualmachineclusterinstancetypes.instancetype.kubevirt.io",
    "virtualmachinepreferences.instancetype.kubevirt.io",
    "virtualmachineclusterpreferences.instancetype.kubevirt.io",
)
_CONTEXT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:/+-]{0,252}")
MAX_OBJECT_BYTES = 4 * 1024 * 1024
# the kinds kvmtune patches, by their full resource name (no short name: 'vm' may mean another CRD on a cluster)
PATCHABLE = {
    "VirtualMachine": "virtualmachines.kubevirt.io",
    "VirtualMachineInstancetype": "virtualmachineinstancetypes.instancetype.kubevirt.io",
    "VirtualMachineClusterInstancetype": "virtualmachineclusterinstancetypes.instancetype.kubevirt.io",
    "VirtualMachinePreference": "virtualmachinepreferences.instancetype.kubevirt.io",
    "VirtualMachineClusterPreference": "virtualmachineclusterpreferences.instancetype.kubevirt.io",
}
CLUSTER_SCOPED = frozenset({"VirtualMachineClusterInstancetype", "VirtualMachineClusterPreference"})
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_VERSION = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_NOT_SERVED = re.compile(r"doesn't have a resource type|the server could not find the requested resource")


def valid_context(context: str) -> bool:
    """A kubeconfig context name kvmtune passes on: no option (``-…``), no space or control character."""
    return _CONTEXT.fullmatch(context) is not None


def get_argv(kind: str, context: str | None) -> list[str]:
    if context is not None and not valid_context(context):
        raise InputError("--kubevirt", f"{context!r} is not a kubeconfig context name kvmtune passes to kubectl")
    return [KUBECTL, *(["--context", context] if context else []), "get", kind, "--all-namespaces", "-o", "json"]


def origin(context: str | None) -> str:
    return f"kubectl://{context or '(current context)'}"


def read_cluster(runner: Runner, context: str | None) -> Read:
    """Every KubeVirt object the context's cluster serves, as :func:`kubevirt.load.read_paths` reads files."""
    from kvmtune.kubevirt.yamldoc import load_documents

    read = Read()
    for kind in KINDS:
        argv = get_argv(kind, context)
        result = runner.run(argv, timeout=TIMEOUT_S, max_output=MAX_JSON_BYTES)
        if result.too_large:
            read.errors.append(f"{' '.join(argv)}: answer larger than {MAX_JSON_BYTES // (1024 * 1024)} MiB; not read")
            continue
        if not result.ok:
            if _NOT_SERVED.search(result.stderr):
                read.notes.append(f"{origin(context)}: {kind} not served by this cluster; not read")
                continue
            read.errors.append(f"{' '.join(argv)}: {result.describe_failure()}")
            if result.returncode == 127 or "context" in result.stderr:
                break  # no kubectl, or no such context: every other kind fails the same way
            continue
        read.files += 1
        where = f"{origin(context)}/{kind}"
        try:
            found: list[KObject] = []
            for doc in load_documents(where, result.stdout):
                found.extend(objects_of(doc))
        except InputError as exc:
            read.errors.append(str(exc))
            continue
        read.objects.extend(found)
    return read


def valid_name(name: str) -> bool:
    """A Kubernetes object or namespace name (DNS-1123 subdomain): nothing kubectl could read as an option."""
    return _NAME.fullmatch(name) is not None


def _where(context: str | None, kind: str, namespace: str | None, name: str) -> list[str]:
    if context is not None and not valid_context(context):
        raise InputError("--kubevirt", f"{context!r} is not a kubeconfig context name kvmtune passes to kubectl")
    if kind not in PATCHABLE:
        raise KvmtuneError(f"{kind!r} is not a kind kvmtune patches")
    if not valid_name(name) or (namespace is not None and not valid_name(namespace)):
        raise KvmtuneError(f"{kind} {name[:80]!r}: not a name kvmtune passes to kubectl")
    ns = [] if kind in CLUSTER_SCOPED else ["-n", namespace or "default"]
    return [*(["--context", context] if context else []), PATCHABLE[kind], name, *ns]


def get_one_argv(context: str | None, kind: str, namespace: str | None, name: str) -> list[str]:
    where = _where(context, kind, namespace, name)
    head = where[:2] if context else []
    return [KUBECTL, *head, "get", *where[len(head):], "-o", "json"]


def patch_argv(context: str | None, kind: str, namespace: str | None, name: str, patch: dict[str, Any]) -> list[str]:
    where = _where(context, kind, namespace, name)
    head = where[:2] if context else []
    return [KUBECTL, *head, "patch", *where[len(head):], "--type", "merge", "-p",
            json.dumps(patch, sort_keys=True, separators=(",", ":"))]


def shell_line(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def run_patch(runner: Runner, argv: list[str]) -> None:
    result = runner.run(argv, timeout=TIMEOUT_S, max_output=MAX_OBJECT_BYTES)
    if not result.ok:
        last = result.stderr.strip().splitlines()[-1][:300] if result.stderr.strip() else "no error output"
        if "Conflict" in result.stderr or "the object has been modified" in result.stderr:
            raise KvmtuneError(f"{argv[argv.index('patch') + 1]} {argv[argv.index('patch') + 2]}: changed since it "
                               f"was read (the API server answered a Conflict); nothing changed: {last}")
        raise KvmtuneError(f"kubectl patch: {result.describe_failure()}")


def get_object(runner: Runner, context: str | None, kind: str, namespace: str | None, name: str) -> dict[str, Any]:
    """One object as the cluster has it now, checked to be the one asked for (kubectl's answer is hostile)."""
    from kvmtune.kubevirt.yamldoc import load_documents

    argv = get_one_argv(context, kind, namespace, name)
    label = f"{kind} {(namespace + '/') if namespace and kind not in CLUSTER_SCOPED else ''}{name}"
    result = runner.run(argv, timeout=TIMEOUT_S, max_output=MAX_OBJECT_BYTES)
    if result.too_large:
        raise KvmtuneError(f"kubectl get {label}: answer larger than {MAX_OBJECT_BYTES // (1024 * 1024)} MiB; not read")
    if not result.ok:
        raise KvmtuneError(f"kubectl get {label}: {result.describe_failure()}")
    docs = load_documents(f"kubectl get {label}", result.stdout)
    obj = docs[0].data if len(docs) == 1 else None
    if not isinstance(obj, dict):
        raise KvmtuneError(f"kubectl get {label}: the answer is not one object")
    raw_meta = obj.get("metadata")
    meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
    if obj.get("kind") != kind or meta.get("name") != name:
        raise KvmtuneError(f"kubectl get {label}: the answer is another object ({str(obj.get('kind'))[:60]} "
                           f"{str(meta.get('name'))[:80]})")
    if kind not in CLUSTER_SCOPED and meta.get("namespace", namespace or "default") != (namespace or "default"):
        raise KvmtuneError(f"kubectl get {label}: the answer is in another namespace")
    if resource_version(obj) is None:
        raise KvmtuneError(f"kubectl get {label}: the answer has no metadata.resourceVersion")
    return obj


def resource_version(obj: Any) -> str | None:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return rv if isinstance(rv, str) and _VERSION.fullmatch(rv) else None


def _conditions(obj: dict[str, Any]) -> list[dict[str, Any]]:
    status = obj.get("status")
    conds = status.get("conditions") if isinstance(status, dict) else None
    return [c for c in conds if isinstance(c, dict)] if isinstance(conds, list) else []


def restart_required(obj: dict[str, Any]) -> bool:
    """The VM's ``RestartRequired`` condition is ``True`` (a spec change the running VMI does not have yet)."""
    return any(c.get("type") == "RestartRequired" and c.get("status") == "True" for c in _conditions(obj))


def runs(obj: dict[str, Any]) -> bool:
    """A VMI exists for the VM (``status.created``, or a ``Ready`` condition): what a spec change waits for."""
    status = obj.get("status")
    if isinstance(status, dict) and status.get("created") is True:
        return True
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in _conditions(obj))
