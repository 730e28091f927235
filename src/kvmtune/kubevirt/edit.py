"""Surgical edits of a manifest: one value set, every other byte of the file kept.

A manifest lives in a GitOps repository; a fix is a diff a reviewer reads. So nothing is re-emitted: PyYAML's
composer gives each node's start and end offset (``start_mark.index``/``end_mark.index``), and an edit either
replaces one scalar's characters, or inserts new ``key: value`` lines into a block mapping at its children's
indentation (the missing mappings of a longer path as nested block lines), or inserts ``"key": value,`` into a
flow mapping (a JSON object) right after its ``{``. Comments, key order, quoting, indentation, a BOM and CRLF
line endings stay as they were. (A round-trip library such as ruamel.yaml re-emits the whole document and can
change quoting, indentation and line width: docs/kubevirt.md.)

Refused, in one line naming the file and the line: a target inside an anchor that aliases share (one edit would
change every place), a tagged or anchored scalar, a block (``|``/``>``) or multi-line scalar, a path through a
value that is not a mapping, an index past a list's end. Every edit is checked afterwards: the edited text is read
again by :mod:`kvmtune.kubevirt.yamldoc` and must hold exactly the old documents with that one value set;
anything else is refused too (an edit that cannot be placed safely is never written).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from kvmtune.errors import InputError
from kvmtune.kubevirt.yamldoc import _Loader, decode, load_documents

Part = str | int
_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")
_PLAIN = re.compile(r"[A-Za-z][A-Za-z0-9._/-]*|[0-9][0-9.]*[A-Za-z][A-Za-z0-9.]*")
_YAML11_WORDS = frozenset({"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"})
BOM = b"\xef\xbb\xbf"


class EditRefused(InputError):
    """An edit kvmtune does not make: the file and line, and why."""


def parts_of(path: str) -> list[Part]:
    """``spec.template.spec.domain.devices.disks[1].disk.bus`` as keys and indexes."""
    out: list[Part] = []
    pos = 0
    for dot_part in path.split("."):
        pos = 0
        while pos < len(dot_part):
            m = _PART.match(dot_part, pos)
            if m is None:
                raise ValueError(f"not a spec path: {path!r}")
            out.append(m.group(1) if m.group(1) is not None else int(m.group(2)))
            pos = m.end()
    return out


def leaves(path: str, value: Any) -> Iterator[tuple[str, Any]]:
    """A value to set as the scalar (or empty ``{}``) leaves it is made of, each with its path."""
    if isinstance(value, dict) and value:
        for k, v in value.items():
            yield from leaves(f"{path}.{k}", v)
    else:
        yield path, value


def set_in(data: Any, parts: list[Part], value: Any) -> None:
    """``value`` set at ``parts`` in plain data (missing mappings created): what an edit must produce."""
    cur = data
    for part in parts[:-1]:
        cur = cur[part] if isinstance(part, int) else cur.setdefault(part, {})
    cur[parts[-1]] = copy.deepcopy(value)


def get_in(data: Any, parts: list[Part]) -> tuple[bool, Any]:
    cur = data
    for part in parts:
        if isinstance(part, int):
            if not isinstance(cur, list) or part >= len(cur):
                return False, None
            cur = cur[part]
        else:
            if not isinstance(cur, dict) or part not in cur:
                return False, None
            cur = cur[part]
    return True, cur


def edit_bytes(where: str, data: bytes, edits: list[tuple[int, str, Any]]) -> bytes:
    """``data`` with each ``(document number, path, value)`` set (a dict value as its leaves), every other byte
    kept; :class:`EditRefused` (nothing changed) when one cannot be made safely."""
    bom = data.startswith(BOM)
    text = decode(where, data)
    for number, path, value in edits:
        for leaf, v in leaves(path, value):
            text = _edit_text(where, text, number, parts_of(leaf), v)
    return (BOM if bom else b"") + text.encode("utf-8")


def _edit_text(where: str, text: str, number: int, parts: list[Part], value: Any) -> str:
    before = [d.data for d in load_documents(where, text)]
    if number >= len(before):
        raise EditRefused(where, f"has no document {number + 1}; not edited")
    found, current = get_in(before[number], parts)
    if found and (current == value or (value == {} and isinstance(current, dict))):
        return text
    try:
        nodes = [n for n in yaml.compose_all(text, Loader=_Loader) if n is not None]
    except (yaml.YAMLError, RecursionError):  # JSON that only Python's json reads: no positions to edit at
        raise EditRefused(where, "readable only as JSON, without the positions an edit needs; not edited") from None
    if len(nodes) != len(before):
        raise EditRefused(where, "its documents cannot be told apart for an edit; not edited")
    new = _Editor(where, text, nodes[number]).set(parts, value)
    expected = copy.deepcopy(before)
    set_in(expected[number], parts, value)
    try:
        after = [d.data for d in load_documents(where, new)]
    except InputError as exc:
        raise EditRefused(where, f"setting {_show(parts)} would leave text kvmtune cannot read ({exc.problem}); "
                          "not edited") from None
    if after != expected:
        raise EditRefused(where, f"setting {_show(parts)} would change more than that value; not edited")
    return new


def _show(parts: list[Part]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(parts))


class _Editor:
    def __init__(self, where: str, text: str, root: Node) -> None:
        self.where = where
        self.text = text
        self.root = root
        self.newline = "\r\n" if "\r\n" in text else "\r" if "\r" in text and "\n" not in text else "\n"
        self.json = where.lower().endswith(".json")
        self.uses: dict[int, int] = {}
        self._count(root, set())

    def _count(self, node: Node, seen: set[int]) -> None:
        self.uses[id(node)] = self.uses.get(id(node), 0) + 1
        if self.uses[id(node)] > 1 or id(node) in seen:
            return  # an alias: its children are counted once (yamldoc already refused bombs and recursion)
        if isinstance(node, MappingNode):
            for k, v in node.value:
                self._count(k, seen)
                self._count(v, seen)
        elif isinstance(node, SequenceNode):
            for item in node.value:
                self._count(item, seen)

    def refuse(self, node: Node, why: str) -> EditRefused:
        return EditRefused(self.where, f"{why}; not edited", node.start_mark.line + 1)

    def _shared(self, node: Node, parts: list[Part]) -> None:
        if self.uses.get(id(node), 0) > 1:
            raise self.refuse(node, f"{_show(parts)} is inside an anchor that aliases share (one edit would change "
                              "every place that uses it)")

    def set(self, parts: list[Part], value: Any) -> str:
        node: Node = self.root
        key_column = -1
        for i, part in enumerate(parts):
            self._shared(node, parts[:i] or parts)
            if isinstance(part, int):
                if not isinstance(node, SequenceNode) or part >= len(node.value):
                    raise self.refuse(node, f"{_show(parts[:i + 1])} is not an item of a list")
                node = node.value[part]
                continue
            if not isinstance(node, MappingNode):
                raise self.refuse(node, f"{_show(parts[:i]) or 'the document'} is not a mapping")
            child = next(((k, v) for k, v in node.value if isinstance(k, ScalarNode) and k.value == part), None)
            if child is None:
                return self._insert(node, parts, i, value, key_column)
            key_column = child[0].start_mark.column
            node = child[1]
        self._shared(node, parts)
        if not isinstance(node, ScalarNode):
            raise self.refuse(node, f"{_show(parts)} is a {'list' if isinstance(node, SequenceNode) else 'mapping'}, "
                              "not a value kvmtune replaces")
        return self._replace(node, parts, value)

    def _replace(self, node: ScalarNode, parts: list[Part], value: Any) -> str:
        start, end = node.start_mark.index, node.end_mark.index
        span = self.text[start:end]
        if node.style in ("|", ">") or "\n" in span or "\r" in span:
            raise self.refuse(node, f"{_show(parts)} is a multi-line value")
        if span.startswith(("!", "&", "*")):
            raise self.refuse(node, f"{_show(parts)} carries a tag or an anchor")
        flow = self._in_flow(start)
        rendered = _flow(value) if flow and self.json else _block_scalar(value)
        if not span and start > 0 and self.text[start - 1] == ":":
            rendered = " " + rendered  # an empty value right after its key's colon
        return self.text[:start] + rendered + self.text[end:]

    def _in_flow(self, index: int) -> bool:
        """Is ``index`` inside a flow collection (``{…}``/``[…]``, JSON)? Counted from the document's start,
        brackets in quoted scalars and comments aside."""
        depth = 0
        quote = ""
        comment = False
        i = self.root.start_mark.index
        while i < index:
            ch = self.text[i]
            if comment:
                comment = ch not in "\r\n"
            elif quote:
                if ch == "\\" and quote == '"':
                    i += 1
                elif ch == quote:
                    quote = ""
            elif ch in "\"'" and (i == 0 or self.text[i - 1] in " \t\n\r[{,:"):
                quote = ch
            elif ch == "#" and (i == 0 or self.text[i - 1] in " \t\r\n"):
                comment = True
            elif ch in "[{":
                depth += 1
            elif ch in "]}":
                depth -= 1
            i += 1
        return depth > 0

    def _insert(self, mapping: MappingNode, parts: list[Part], i: int, value: Any, key_column: int) -> str:
        rest = parts[i:]
        if any(isinstance(p, int) for p in rest):
            raise self.refuse(mapping, f"{_show(parts[:i + 1])} is missing and holds a list item")
        keys = [str(p) for p in rest]
        if mapping.flow_style or not mapping.value:
            return self._insert_flow(mapping, parts, keys, value)
        column = mapping.value[0][0].start_mark.column
        step = column - key_column if key_column >= 0 and column > key_column else 2
        lines = []
        for depth, key in enumerate(keys):
            indent = " " * (column + depth * step)
            lines.append(f"{indent}{_key(key)}:" + ("" if depth < len(keys) - 1 else " " + _block_scalar(value)))
        block = self.newline.join(lines) + self.newline
        at = self._end_of_last_entry(mapping, parts)
        if at == len(self.text) and not self.text.endswith(("\n", "\r")):
            return self.text + self.newline + block.removesuffix(self.newline)
        return self.text[:at] + block + self.text[at:]

    def _end_of_last_entry(self, mapping: MappingNode, parts: list[Part]) -> int:
        """The offset just after the line holding the mapping's last value (its last scalar, or the bracket that
        closes its last flow collection): where a new entry goes."""
        node: Node = mapping
        while isinstance(node, MappingNode | SequenceNode) and not node.flow_style:
            if self.uses.get(id(node), 0) > 1:
                raise self.refuse(node, f"the entries of {_show(parts[:-1])} end in an alias")
            if isinstance(node, MappingNode):
                k, v = node.value[-1]
                if isinstance(v, ScalarNode) and v.value == "" and v.style is None:
                    node = k  # `key:` with no value: its mark may be on a later line
                    break
                node = v
            else:
                node = node.value[-1]
        if self.uses.get(id(node), 0) > 1:
            raise self.refuse(node, f"the entries of {_show(parts[:-1])} end in an alias")
        if isinstance(node, ScalarNode) and node.style in ("|", ">"):
            raise self.refuse(node, f"the entries of {_show(parts[:-1])} end in a block scalar ('|' or '>'), after "
                              "which a new line cannot be placed safely")
        end = node.end_mark.index
        nl = self.text.find(self.newline[-1], end)
        return len(self.text) if nl < 0 else nl + 1

    def _closes_flow(self, end: int) -> bool:
        """Only blanks (and line breaks) between ``end`` and the mapping's closing ``}``: a safe place."""
        rest = self.text[end:end + 4096].lstrip(" \t\r\n")
        return rest[:1] == "}"

    def _insert_flow(self, mapping: MappingNode, parts: list[Part], keys: list[str], value: Any) -> str:
        start = mapping.start_mark.index
        if self.text[start:start + 1] != "{":
            raise self.refuse(mapping, f"{_show(parts[:len(parts) - len(keys)])} is not written as a plain mapping")
        rendered = _flow(value) if self.json else _block_scalar(value)
        for key in reversed(keys):
            rendered = "{" + (json.dumps(key) if self.json else _key(key)) + ": " + rendered + "}"
        inner = rendered[1:-1]
        if mapping.value:
            last = mapping.value[-1][1]
            end = last.end_mark.index
            single = isinstance(last, ScalarNode) and last.style not in ("|", ">") and \
                "\n" not in self.text[last.start_mark.index:end]
            flow = isinstance(last, MappingNode | SequenceNode) and last.flow_style
            if self.uses.get(id(last), 0) == 1 and (single or flow) and self._closes_flow(end):
                return self.text[:end] + ", " + inner + self.text[end:]  # last: the order a reader expects
            inner += ", "
        elif self.text[start + 1:start + 2] == "}":
            pass
        else:
            closing = self.text.find("}", start)
            if closing < 0 or self.text[start + 1:closing].strip():
                raise self.refuse(mapping, f"{_show(parts[:len(parts) - len(keys)])} is an empty mapping kvmtune "
                                  "cannot place a key in")
        return self.text[:start + 1] + inner + self.text[start + 1:]


def _key(key: str) -> str:
    return key if _PLAIN.fullmatch(key) and key.lower() not in _YAML11_WORDS else json.dumps(key)


def _flow(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _block_scalar(value: Any) -> str:
    """A value as YAML writes it on a block line: ``true``, ``4``, ``virtio``, ``"1.5"`` (quoted where a plain
    scalar would read as another type or is not plain-safe), ``{}``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float) or value is None or isinstance(value, dict | list):
        return _flow(value)
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in _YAML11_WORDS and not re.fullmatch(r"[0-9.eE+-]+", text):
        return text
    return json.dumps(text, ensure_ascii=False)
