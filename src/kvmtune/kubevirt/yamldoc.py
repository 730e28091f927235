"""YAML and JSON manifests read as hostile input, every value with the line and column it was written at.

PyYAML's composer builds the node graph (with each node's start mark) and nothing else runs on it: no
constructor, so no tag can build an object. This module turns the nodes into plain data itself and refuses,
in one line naming the file and the line:

- a tag other than YAML's core ones (``!!python/object``, ``!custom``);
- a duplicate key in one mapping (YAML says keys are unique; parsers disagree on which one wins), a key that
  is not a scalar, a merge key ``<<`` (kubectl's YAML library and PyYAML treat it differently);
- a document of more than :data:`MAX_NODES` values after aliases are followed (an alias bomb), an alias of
  an anchor that contains it, nesting deeper than :data:`MAX_DEPTH` (counted from the parser's events before
  anything is composed: libyaml's composer recurses in C and a million levels crash the process), spec paths of
  more than :data:`MAX_PATH_CHARS` characters in all (long keys above many values: each value's path repeats them);
- a line break YAML counts but editors and SARIF viewers do not (U+0085, U+2028, U+2029), so the line a
  finding names is the line an operator's editor shows;
- text that is not UTF-8.

A path into a document is written as KubeVirt's documentation writes one:
``spec.template.spec.domain.devices.disks[1].disk.bus``.
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from kvmtune.errors import InputError
from kvmtune.kubevirt.document import Document

MAX_NODES = 200_000  # values in one file, aliases followed: far above any VM manifest, far below a bomb's billions
MAX_DEPTH = 64  # a VirtualMachinePool's deepest field is about 12 levels down
# characters of all the spec paths one file's values are named by: 200,000 values of a `kubectl get -o yaml` list
# average well under 100; a 1 MiB key above 200,000 values would have made 200 GB of paths in an 8 MiB file
MAX_PATH_CHARS = 40_000_000
_CORE = "tag:yaml.org,2002:"
_SCALAR_TAGS = frozenset(_CORE + t for t in ("str", "int", "float", "bool", "null", "timestamp", "binary"))
_ODD_BREAKS = {"\x85": "U+0085 (NEL)", "\u2028": "U+2028 (line separator)", "\u2029": "U+2029 (paragraph separator)"}

try:  # libyaml's composer when present: the same nodes and marks, faster
    _Loader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - PyYAML built without libyaml
    _Loader = yaml.SafeLoader


def decode(path: str, data: bytes) -> str:
    """UTF-8 text (a BOM dropped); anything else refused with the offset of the first bad byte."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(path, f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); not read") from None
    for ch, name in _ODD_BREAKS.items():
        at = text.find(ch)
        if at >= 0:
            line = text.count("\n", 0, at) + 1
            raise InputError(path, f"{name} is a line break to YAML but not to editors; not read", line)
    return text


def load_documents(path: str, text: str) -> list[Document]:
    """Every document of ``text`` (one for JSON), refused as a whole on the first problem."""
    try:
        _check_depth(path, text)  # before composing: libyaml's composer recurses in C and crashes past ~50,000 levels
        nodes = list(yaml.compose_all(text, Loader=_Loader))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = (exc.problem or exc.context or "not YAML").strip()
        if "nesting depth" in problem:  # newer libyaml (PyPI's PyYAML >= 6.0.2) stops deep nesting in its parser
            raise InputError(path, f"nested more than {MAX_DEPTH} levels deep; not read",
                             mark.line + 1 if mark else None) from None
        if path.endswith(".json"):
            return _json_document(path, text)
        raise InputError(path, f"not valid YAML: {problem}", mark.line + 1 if mark else None) from None
    except yaml.YAMLError as exc:
        raise InputError(path, f"not valid YAML: {str(exc).splitlines()[0] if str(exc) else 'unreadable'}") from None
    except RecursionError:
        raise InputError(path, "nested too deeply to be a manifest; not read") from None
    docs: list[Document] = []
    budget = [MAX_NODES, MAX_PATH_CHARS]
    for node in nodes:
        if node is None:
            continue
        doc = Document(path, None, number=len(docs))
        doc.data = _value(node, "", doc, budget, 0, set())
        docs.append(doc)
    return docs


def _check_depth(path: str, text: str) -> None:
    """Refuse nesting deeper than :data:`MAX_DEPTH` from the parser's events (a state machine, no recursion)."""
    depth = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                line = event.start_mark.line + 1 if event.start_mark else None
                raise InputError(path, f"nested more than {MAX_DEPTH} levels deep; not read", line)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _json_document(path: str, text: str) -> list[Document]:
    """JSON that YAML 1.1 does not take (tabs, say): read by ``json``, duplicate keys refused, positions unknown."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out:
                raise InputError(path, f"duplicate key '{k[:80]}'; not read")
            out[k] = v
        return out

    try:
        data = json.loads(text, object_pairs_hook=pairs)
    except RecursionError:  # Python 3.13's json raises it for deep arrays where 3.11's C scanner did not
        raise InputError(path, "nested too deeply to be a manifest; not read") from None
    except ValueError as exc:
        raise InputError(path, f"not valid JSON or YAML ({str(exc).splitlines()[0][:120]})") from None
    return [Document(path, data)]


def _fail(doc: Document, node: Node, problem: str) -> InputError:
    return InputError(doc.path, problem, node.start_mark.line + 1)


def _value(node: Node, where: str, doc: Document, budget: list[int], depth: int, active: set[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise _fail(doc, node, f"more than {MAX_NODES} values (an alias bomb?); not read")
    if depth > MAX_DEPTH:
        raise _fail(doc, node, f"nested more than {MAX_DEPTH} levels deep; not read")
    budget[1] -= len(where)
    if budget[1] < 0:
        raise _fail(doc, node, f"its values' paths are more than {MAX_PATH_CHARS:,} characters in all (keys of "
                    "that length are no manifest's); not read")
    if where not in doc.positions:
        doc.positions[where] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if id(node) in active:
        raise _fail(doc, node, "an alias of an anchor that contains it (a recursive document); not read")
    if isinstance(node, ScalarNode):
        return _scalar(node, doc)
    active.add(id(node))
    try:
        if isinstance(node, SequenceNode):
            _tag(node, doc, _CORE + "seq")
            return [_value(item, f"{where}[{i}]", doc, budget, depth + 1, active) for i, item in enumerate(node.value)]
        if isinstance(node, MappingNode):
            _tag(node, doc, _CORE + "map")
            out: dict[str, Any] = {}
            for knode, vnode in node.value:
                if not isinstance(knode, ScalarNode) or knode.tag == _CORE + "merge":
                    raise _fail(doc, knode, "a key that is not a plain scalar (or a merge key '<<'); not read")
                key = str(_scalar(knode, doc))
                if key in out:
                    raise _fail(doc, knode, f"duplicate key '{key[:80]}' (YAML keys are unique); not read")
                child = f"{where}.{key}" if where else key
                doc.positions.setdefault(child, (knode.start_mark.line + 1, knode.start_mark.column + 1))  # the key
                out[key] = _value(vnode, child, doc, budget, depth + 1, active)
            return out
    finally:
        active.discard(id(node))
    raise _fail(doc, node, "an unknown kind of YAML node; not read")  # pragma: no cover


def _tag(node: Node, doc: Document, wanted: str) -> None:
    if node.tag != wanted:
        raise _fail(doc, node, f"tag '{str(node.tag)[:60]}' is not a plain YAML type; not read")


_CONSTRUCT = SafeConstructor()


def _scalar(node: ScalarNode, doc: Document) -> Any:
    tag = node.tag
    if tag not in _SCALAR_TAGS:
        raise _fail(doc, node, f"tag '{str(tag)[:60]}' is not a plain YAML type; not read")
    kind = tag[len(_CORE):]
    try:
        if kind == "int":
            return _CONSTRUCT.construct_yaml_int(node)
        if kind == "float":
            return _CONSTRUCT.construct_yaml_float(node)
        if kind == "bool":
            return _CONSTRUCT.construct_yaml_bool(node)
        if kind == "null":
            return None
    except (ValueError, ConstructorError) as exc:
        raise _fail(doc, node, f"value not readable as {kind} ({str(exc)[:80]}); not read") from None
    return str(node.value)  # str, and timestamps and binary kept as written
