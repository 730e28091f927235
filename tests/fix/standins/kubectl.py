"""A recording stand-in for ``kubectl``: ``[--context C] get KIND --all-namespaces -o json``, answered from the
directory ``KVMTUNE_KUBECTL_DIR`` (``<KIND>.json``, a ``kind: List`` as kubectl prints it). A kind with no file is
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
    if len(argv) != 5 or argv[0] != "get" or argv[2:] != ["--all-namespaces", "-o", "json"]:
        print(f"stand-in kubectl: unsupported call {argv}", file=sys.stderr)
        return 2
    answer = Path(os.environ["KVMTUNE_KUBECTL_DIR"]) / f"{argv[1]}.json"
    if not answer.is_file():
        print(f'error: the server doesn\'t have a resource type "{argv[1]}"', file=sys.stderr)
        return 1
    sys.stdout.write(answer.read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
