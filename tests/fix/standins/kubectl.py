"""A recording stand-in for ``kubectl``: ``[--context C] get KIND --all-namespaces -o json``, answered from the
directory ``KVMTUNE_KUBECTL_DIR`` (``<KIND>.json``, a ``kind: List`` as kubectl prints it); ``get pods -n NS -l K=V -o
json`` and ``exec -n NS POD -c CONTAINER -- virsh dumpxml DOMAIN`` as their functions below say. A kind with no file is
answered as a cluster without that CRD answers (``error: the server doesn't have a resource type "…"``, exit 1); a
context other than ``KVMTUNE_KUBECTL_CONTEXTS`` (comma-separated; default ``kind-kubevirt``) as kubectl answers an
unknown one. Every call is appended to ``KVMTUNE_KUBECTL_LOG`` as a JSON list. No real cluster is ever reached.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


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
    if len(argv) != 5 or argv[0] != "get" or argv[2:] != ["--all-namespaces", "-o", "json"]:
        print(f"stand-in kubectl: unsupported call {argv}", file=sys.stderr)
        return 2
    answer = Path(os.environ["KVMTUNE_KUBECTL_DIR"]) / f"{argv[1]}.json"
    if not answer.is_file():
        print(f'error: the server doesn\'t have a resource type "{argv[1]}"', file=sys.stderr)
        return 1
    sys.stdout.write(answer.read_text(encoding="utf-8"))
    return 0


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
    answer = there / f"{domain}.xml"
    if not answer.is_file():
        print(f"error: failed to get domain '{domain}'", file=sys.stderr)
        print("command terminated with exit code 1", file=sys.stderr)
        return 1
    sys.stdout.buffer.write(answer.read_bytes())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
