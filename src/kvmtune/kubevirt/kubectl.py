"""KubeVirt objects from a cluster: ``kubectl [--context C] get KIND --all-namespaces -o json``, one call per kind,
through the one :class:`~kvmtune.runner.Runner`. Read-only: kvmtune never writes to a cluster from here.

What kubectl prints is hostile like any manifest: at most :data:`MAX_JSON_BYTES`, read by the same reader as files
(``yamldoc``: duplicate keys, tags, alias bombs refused), a ``kind: List`` of objects. A kind the cluster does not
serve (no pool CRD, an older KubeVirt without instancetypes) is said in one line and the others are read; a failing
kubectl (no such context, no access) is one line naming the command.
"""

from __future__ import annotations

import re

from kvmtune.errors import InputError
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
        result = runner.run(argv, timeout=TIMEOUT_S)
        if not result.ok:
            if _NOT_SERVED.search(result.stderr):
                read.notes.append(f"{origin(context)}: {kind} not served by this cluster; not read")
                continue
            read.errors.append(f"{' '.join(argv)}: {result.describe_failure()}")
            if result.returncode == 127 or "context" in result.stderr:
                break  # no kubectl, or no such context: every other kind fails the same way
            continue
        if len(result.stdout) > MAX_JSON_BYTES:
            read.errors.append(f"{' '.join(argv)}: answer larger than {MAX_JSON_BYTES // (1024 * 1024)} MiB; not read")
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
