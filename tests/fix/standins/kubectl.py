"""A recording stand-in for ``kubectl``: ``[--context C] get KIND --all-namespaces -o json``, answered from the
directory ``KVMTUNE_KUBECTL_DIR`` (``<KIND>.json``, a ``kind: List`` as kubectl prints it); ``get pods -n NS -l K=V -o
json`` and ``exec -n NS POD -c CONTAINER -- virsh dumpxml DOMAIN`` as their functions below say. A kind with no file is
answered as a cluster without that CRD answers (``error: the server doesn't have a resource type "…"``, exit 1); a
context other than ``KVMTUNE_KUBECTL_CONTEXTS`` (comma-separated; default ``kind-kubevirt``) as kubectl answers an
unknown one. Every call is appended to ``KVMTUNE_KUBECTL_LOG`` as a JSON list. No real cluster is ever reached.

One object (``get RESOURCE NAME [-n NS] -o json``) is answered from the same list files, and ``patch RESOURCE NAME
[-n NS] --type merge -p JSON`` changes it there as the API server does: an RFC 7386 merge patch, refused with
kubectl's Conflict message (exit 1) when the patch carries a ``metadata.resourceVersion`` other than the object's;
the resourceVersion is bumped, and a VirtualMachine that runs (``status.created``) whose spec changed gets a
``RestartRequired`` condition (KubeVirt's Stage rollout). Test hooks: ``KVMTUNE_KUBECTL_RACE`` ``get`` (another
writer bumps the object just before each single get) or ``patch`` (just before each patch);
``KVMTUNE_KUBECTL_LIE`` ``kind``, ``name``, ``no-rv``, ``giant`` (a single get answers another kind, another
name, no resourceVersion, or 5 MiB of it); ``KVMTUNE_KUBECTL_FLOOD`` N: ``exec`` answers N bytes of one endless XML
comment (a tenant's pod answering for ever), as fast as the pipe takes them, and stops quietly when it closes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def main(argv: list[str]) -> int:
    log = os.environ.get("KVMTUNE_KUBECTL_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps(argv) + "\n")
    context = None
    if argv[:1] == ["--context"]:
        context, argv = argv[1], argv[2:]
    known = os.environ.get("KVMTUNE_KUBECTL_CONTEXTS", "kind-kubevirt").split(",")
    if context is not None and context not in known:
        print(f'error: context "{context}" does not exist', file=sys.stderr)
        return 1
    if argv[:2] == ["get", "pods"]:
        return get_pods(argv[2:])
    if argv[:1] == ["exec"]:
        return exec_virsh(argv[1:])
    if argv[:1] == ["patch"]:
        return patch_object(argv[1:])
    if argv[:1] == ["get"] and "--all-namespaces" not in argv:
        return get_object(argv[1:])
    if len(argv) != 5 or argv[0] != "get" or argv[2:] != ["--all-namespaces", "-o", "json"]:
        print(f"stand-in kubectl: unsupported call {argv}", file=sys.stderr)
        return 2
    answer = Path(os.environ["KVMTUNE_KUBECTL_DIR"]) / f"{argv[1]}.json"
    if not answer.is_file():
        print(f'error: the server doesn\'t have a resource type "{argv[1]}"', file=sys.stderr)
        return 1
    sys.stdout.write(answer.read_text(encoding="utf-8"))
    return 0


# --------------------------------------------------------------------------- one object: get and patch


def _where(args: list[str]) -> tuple[str, str, str | None, list[str]]:
    """RESOURCE NAME [-n NS] and the rest of the arguments."""
    resource, name, rest = args[0], args[1], args[2:]
    ns = None
    if rest[:1] == ["-n"]:
        ns, rest = rest[1], rest[2:]
    return resource, name, ns, rest


def _find(resource: str, name: str, ns: str | None) -> tuple[Path, dict[str, Any], int | None]:
    store = Path(os.environ["KVMTUNE_KUBECTL_DIR"]) / f"{resource}.json"
    doc: dict[str, Any] = json.loads(store.read_text(encoding="utf-8")) if store.is_file() else {"items": []}
    for i, item in enumerate(doc.get("items", [])):
        meta = item.get("metadata", {})
        if meta.get("name") == name and (ns is None or meta.get("namespace", "default") == ns):
            return store, doc, i
    return store, doc, None


def _not_found(resource: str, name: str) -> int:
    print(f'Error from server (NotFound): {resource} "{name}" not found', file=sys.stderr)
    return 1


def _bump(item: dict[str, Any]) -> None:
    meta = item.setdefault("metadata", {})
    meta["resourceVersion"] = str(int(meta.get("resourceVersion", "0") or 0) + 1)


def get_object(args: list[str]) -> int:
    resource, name, ns, rest = _where(args)
    if rest != ["-o", "json"]:
        print(f"stand-in kubectl: unsupported get {args}", file=sys.stderr)
        return 2
    store, doc, i = _find(resource, name, ns)
    if i is None:
        return _not_found(resource, name)
    if os.environ.get("KVMTUNE_KUBECTL_RACE") == "get":
        _bump(doc["items"][i])
        store.write_text(json.dumps(doc, indent=4), encoding="utf-8")
    item = dict(doc["items"][i])
    lie = os.environ.get("KVMTUNE_KUBECTL_LIE", "")
    if lie == "kind":
        item["kind"] = "Pod"
    elif lie == "name":
        item["metadata"] = {**item["metadata"], "name": "someone-else"}
    elif lie == "no-rv":
        item["metadata"] = {k: v for k, v in item["metadata"].items() if k != "resourceVersion"}
    elif lie == "giant":
        item["metadata"] = {**item["metadata"], "annotations": {"pad": "x" * (5 * 1024 * 1024)}}
    sys.stdout.write(json.dumps(item, indent=4) + "\n")
    return 0


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386 MergePatch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge(out.get(k), v)
    return out


def patch_object(args: list[str]) -> int:
    resource, name, ns, rest = _where(args)
    if len(rest) != 4 or rest[:3] != ["--type", "merge", "-p"]:
        print(f"stand-in kubectl: unsupported patch {args}", file=sys.stderr)
        return 2
    try:
        patch = json.loads(rest[3])
    except ValueError:
        print("error: unable to parse the patch: invalid JSON", file=sys.stderr)
        return 1
    store, doc, i = _find(resource, name, ns)
    if i is None:
        return _not_found(resource, name)
    item = doc["items"][i]
    if os.environ.get("KVMTUNE_KUBECTL_RACE") == "patch":
        _bump(item)
    wanted = (patch.get("metadata") or {}).get("resourceVersion")
    if wanted is not None and wanted != item.get("metadata", {}).get("resourceVersion"):
        store.write_text(json.dumps(doc, indent=4), encoding="utf-8")
        print(f'Error from server (Conflict): Operation cannot be fulfilled on {resource} "{name}": the object has '
              "been modified; please apply your changes to the latest version and try again", file=sys.stderr)
        return 1
    new = merge(item, patch)
    if new == item:
        print(f"{resource.split('.', 1)[0]}/{name} patched (no change)")
        return 0
    _bump(new)
    status = new.get("status") if isinstance(new.get("status"), dict) else {}
    if new.get("kind") == "VirtualMachine" and new.get("spec") != item.get("spec") and status.get("created") is True:
        conds = [c for c in status.get("conditions", []) if c.get("type") != "RestartRequired"]
        conds.append({"type": "RestartRequired", "status": "True",
                      "message": "a non-live-updatable field was changed in the template spec"})
        new["status"] = {**status, "conditions": conds}
    doc["items"][i] = new
    store.write_text(json.dumps(doc, indent=4), encoding="utf-8")
    print(f"{resource.split('.', 1)[0]}/{name} patched")


def get_pods(argv: list[str]) -> int:
    """``get pods -n NS -l KEY=VALUE -o json``: ``pods.<NS>.json`` verbatim where a test wrote one (an answer as a
    lying or broken API server would give it), else the items of ``pods.json`` in NS whose label KEY is VALUE."""
    if len(argv) != 6 or argv[0] != "-n" or argv[2] != "-l" or argv[4:] != ["-o", "json"] or "=" not in argv[3]:
        print(f"stand-in kubectl: unsupported get pods {argv}", file=sys.stderr)
        return 2
    ns, (key, _, value) = argv[1], argv[3].partition("=")
    answers = Path(os.environ["KVMTUNE_KUBECTL_DIR"])
    verbatim = answers / f"pods.{ns}.json"
    if "/" not in ns and verbatim.is_file():
        sys.stdout.buffer.write(verbatim.read_bytes())
        return 0
    pods = answers / "pods.json"
    items = json.loads(pods.read_text(encoding="utf-8"))["items"] if pods.is_file() else []
    kept = [p for p in items if p["metadata"].get("namespace") == ns and p["metadata"].get("labels", {}).get(key) == value]
    print(json.dumps({"apiVersion": "v1", "kind": "List", "items": kept, "metadata": {"resourceVersion": ""}}, indent=4))
    return 0


def exec_virsh(argv: list[str]) -> int:
    """``exec -n NS POD -c CONTAINER -- virsh dumpxml DOMAIN``: the bytes of ``dumpxml/<POD>/<DOMAIN>.xml`` verbatim
    (a test may write a lying one), as virsh prints a domain; a pod not in ``pods.json``'s NS (nor a ``dumpxml/<POD>``
    directory), another container or an unknown domain as kubectl and virsh answer them."""
    if len(argv) != 9 or argv[0] != "-n" or argv[3] != "-c" or argv[5:8] != ["--", "virsh", "dumpxml"]:
        print(f"stand-in kubectl: unsupported exec {argv}", file=sys.stderr)
        return 2
    ns, pod, container, domain = argv[1], argv[2], argv[4], argv[8]
    if any("/" in x or x.startswith(".") for x in (pod, domain)):
        print(f"stand-in kubectl: refused path-like name in {argv}", file=sys.stderr)
        return 2
    answers = Path(os.environ["KVMTUNE_KUBECTL_DIR"])
    pods = answers / "pods.json"
    items = json.loads(pods.read_text(encoding="utf-8"))["items"] if pods.is_file() else []
    known = {(p["metadata"].get("namespace"), p["metadata"]["name"]): p for p in items}
    there = answers / "dumpxml" / pod
    if (ns, pod) not in known and not there.is_dir():
        print(f'Error from server (NotFound): pods "{pod}" not found', file=sys.stderr)
        return 1
    if container != "compute":
        print(f"error: container {container} is not valid for pod {pod}", file=sys.stderr)
        return 1
    flood = int(os.environ.get("KVMTUNE_KUBECTL_FLOOD", "0") or 0)
    if flood:
        return _flood(flood, f"<domain type='kvm'><name>{domain}</name><!--".encode())
    answer = there / f"{domain}.xml"
    if not answer.is_file():
        print(f"error: failed to get domain '{domain}'", file=sys.stderr)
        print("command terminated with exit code 1", file=sys.stderr)
        return 1
    sys.stdout.buffer.write(answer.read_bytes())
    return 0


def _flood(n: int, head: bytes) -> int:
    chunk = b"x" * (1 << 20)
    try:
        sys.stdout.buffer.write(head)
        while n > 0:
            sys.stdout.buffer.write(chunk[:n])
            n -= len(chunk)
        sys.stdout.buffer.flush()
    except BrokenPipeError:  # the reader stopped: what a kubectl killed mid-answer sees
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
