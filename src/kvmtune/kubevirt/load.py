"""KubeVirt manifests from files and directories: the objects kvmtune reads, each with where it was written.

A file is YAML or JSON, one or several documents, or a ``kind: List`` (``kubectl get vm -A -o yaml``). A
directory is read one level deep; with ``recursive`` its whole tree (symbolic links followed once each, loops
said). Objects of other kinds (a Service, a ConfigMap) are passed over; a file naming none of KubeVirt's is
said in one line when it was named, counted when it was found in a directory. A Helm template (``{{ … }}``
where YAML cannot read it, or in a value) and a kustomization are refused as templates: render them first.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from typing import Any

from kvmtune.errors import InputError
from kvmtune.inputs import _os_error, kind_of, read_regular, walk_files
from kvmtune.kubevirt.document import Document

MAX_MANIFEST_BYTES = 8 * 1024 * 1024
SUFFIXES = (".yaml", ".yml", ".json")
GROUP = "kubevirt.io"
INSTANCETYPE_GROUP = "instancetype.kubevirt.io"
POOL_GROUP = "pool.kubevirt.io"
GUEST_KINDS = frozenset({"VirtualMachine", "VirtualMachineInstance", "VirtualMachinePool"})
REFERENCED_KINDS = frozenset({"VirtualMachineInstancetype", "VirtualMachineClusterInstancetype",
                              "VirtualMachinePreference", "VirtualMachineClusterPreference"})
CLUSTER_KINDS = frozenset({"VirtualMachineClusterInstancetype", "VirtualMachineClusterPreference"})
_TEMPLATE = re.compile(r"\{\{.*?\}\}|\{\{-")


@dataclass
class KObject:
    """One KubeVirt object as written: its kind, namespace (``None``: not stated), name, body and where."""

    kind: str
    namespace: str | None
    name: str
    body: dict[str, Any]
    doc: Document

    @property
    def key(self) -> tuple[str, str | None, str]:
        return (self.kind, None if self.kind in CLUSTER_KINDS else self.namespace or "default", self.name)

    def where(self, spec_path: str = "") -> str:
        _, (line, col) = self.doc.nearest(spec_path)
        return f"{self.doc.path}:{line}:{col}"


@dataclass
class Read:
    objects: list[KObject] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one line each, naming the file
    notes: list[str] = field(default_factory=list)
    files: int = 0


def is_manifest_name(name: str) -> bool:
    return name.lower().endswith(SUFFIXES)


def manifest_files(raw: str, recursive: bool, read: Read) -> list[str]:
    """The manifest files ``raw`` names: itself, or a directory's (one level, or the tree with ``recursive``)."""
    try:
        st = os.stat(raw)
    except OSError as exc:
        read.errors.append(str(_os_error(raw, exc)))
        return []
    if not stat.S_ISDIR(st.st_mode):
        return [raw]
    if recursive:
        walk = walk_files(raw, is_manifest_name)
        read.errors.extend(walk.problems)
        return walk.files
    files: list[str] = []
    skipped = 0
    try:
        entries = sorted(os.scandir(raw), key=lambda e: e.name)
    except OSError as exc:
        read.errors.append(f"{raw}: cannot list the directory ({exc.strerror or exc})")
        return []
    for entry in entries:
        try:
            est = os.stat(entry.path)
        except OSError as exc:
            if is_manifest_name(entry.name):
                read.errors.append(str(_os_error(entry.path, exc)))
            continue
        if stat.S_ISDIR(est.st_mode):
            skipped += 1
        elif is_manifest_name(entry.name):
            if stat.S_ISREG(est.st_mode):
                files.append(entry.path)
            else:
                read.errors.append(f"{entry.path}: not a regular file ({kind_of(est.st_mode)}); not opened")
    if skipped:
        read.notes.append(f"{raw}: {skipped} subdirector{'y' if skipped == 1 else 'ies'} not read (--recursive reads "
                          "the tree)")
    return files


def read_paths(paths: list[str], recursive: bool = False) -> Read:
    read = Read()
    for raw in paths:
        named = not os.path.isdir(raw)
        for path in manifest_files(raw, recursive, read):
            read.files += 1
            try:
                found = read_file(path)
            except InputError as exc:
                read.errors.append(str(exc))
                continue
            if not found and named:
                read.errors.append(f"{path}: no KubeVirt VirtualMachine, VirtualMachineInstance, VirtualMachinePool, "
                                   "instancetype or preference in it")
            read.objects.extend(found)
    return read


def read_file(path: str) -> list[KObject]:
    return read_bytes(path, read_regular(path, MAX_MANIFEST_BYTES, "a manifest"))


def read_bytes(path: str, data: bytes) -> list[KObject]:
    """The KubeVirt objects of a manifest's bytes (``fix`` reads a file once and re-reads its edited bytes)."""
    from kvmtune.kubevirt.yamldoc import decode, load_documents  # PyYAML only when a manifest is read

    text = decode(path, data)
    try:
        docs = load_documents(path, text)
    except InputError as exc:
        if _TEMPLATE.search(text):
            raise InputError(path, "a template (Helm '{{ … }}'), not a manifest: render it first (helm template) "
                             "and audit the output", exc.line) from None
        raise
    out: list[KObject] = []
    for doc in docs:
        out.extend(_objects(doc))
    return out


def objects_of(doc: Document) -> list[KObject]:
    """The KubeVirt objects of one document (a ``kind: List``'s items each), other kinds passed over."""
    return _objects(doc)


def _objects(doc: Document) -> list[KObject]:
    data = doc.data
    if not isinstance(data, dict):
        return []
    kind = data.get("kind")
    if kind == "Kustomization":
        raise InputError(doc.path, "a kustomization: its patches are not applied yet; run 'kustomize build' and "
                         "audit the output")
    if kind == "List" or (isinstance(kind, str) and kind.endswith("List") and isinstance(data.get("items"), list)):
        out: list[KObject] = []
        for i, item in enumerate(data.get("items") or []):
            sub = Document(doc.path, item, doc.positions, prefix=f"items[{i}]", number=doc.number)
            out.extend(_objects(sub))
        return out
    if kind not in GUEST_KINDS and kind not in REFERENCED_KINDS:
        return []
    group = str(data.get("apiVersion", "")).split("/", 1)[0]
    if group not in (GROUP, INSTANCETYPE_GROUP, POOL_GROUP):
        return []
    meta = data.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        where = doc.nearest("metadata")[1][0]
        raise InputError(doc.path, f"a {kind} without metadata.name; not read", where)
    _refuse_templated(doc, data)
    ns = meta.get("namespace")
    return [KObject(str(kind), ns if isinstance(ns, str) and ns else None, meta["name"], data, doc)]


def _refuse_templated(doc: Document, data: Any, path: str = "") -> None:
    """A ``{{ … }}`` left in a value kvmtune reads (cloud-init user data aside: Jinja is its own) is a template."""
    if isinstance(data, dict):
        for k, v in data.items():
            if k in ("userData", "networkData", "userDataBase64", "networkDataBase64", "annotations", "labels"):
                continue
            _refuse_templated(doc, v, f"{path}.{k}" if path else k)
    elif isinstance(data, list):
        for i, v in enumerate(data):
            _refuse_templated(doc, v, f"{path}[{i}]")
    elif isinstance(data, str) and _TEMPLATE.search(data):
        line = doc.nearest(path)[1][0]
        raise InputError(doc.path, f"a template (Helm '{{{{ … }}}}' in {path}), not a manifest: render it first "
                         "(helm template) and audit the output", line)
