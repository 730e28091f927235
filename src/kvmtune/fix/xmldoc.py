"""Byte-preserving edits of a domain XML document.

A fixer edits the lxml tree the auditor read (``guest.tree``; each ``Disk`` and
``Nic`` keeps its element), but serialising that tree with lxml would rewrite
every quote, blank and empty-element form in the file. :class:`XmlDoc` records
each edit twice: on the tree (so a re-audit sees it) and as a patch against the
original bytes (so everything the edit does not touch stays byte-for-byte:
comments, ``<metadata>``, ``qemu:commandline``, attribute order and quoting).

After the edits, :meth:`XmlDoc.render` re-parses the patched bytes and checks that
they mean the same document as the edited tree; a mismatch is a bug, refused.

The original bytes were already parsed by :func:`kvmtune.domain.xml.parse_xml_bytes`
(no DTD, no entities), so a small tokenizer over them is exact: element start
tags appear in the same order as ``root.iter()`` yields elements.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

from lxml import etree

from kvmtune.errors import KvmtuneError

_TOKEN = re.compile(
    rb"<!--.*?-->"
    rb"|<!\[CDATA\[.*?\]\]>"
    rb"|<\?.*?\?>"
    rb"|</(?P<end>[^\s>]+)\s*>"
    rb"|<(?P<start>[^\s/>!?]+)(?P<attrs>(?:\s+[^\s=/>]+\s*=\s*(?:'[^']*'|\"[^\"]*\"))*)\s*(?P<empty>/?)>",
    re.S,
)
_ATTR = re.compile(rb"(\s+)([^\s=/>]+)(\s*=\s*)(?:'([^']*)'|\"([^\"]*)\")")


class XmlEditError(KvmtuneError):
    """The document cannot be edited safely (a kvmtune bug or an unusual file)."""


@dataclass
class _Span:
    start: int  # '<' of the start tag
    tag_end: int  # just after the start tag's '>'
    end_start: int  # '<' of the end tag (== tag_end for an empty element)
    end: int  # just after the end tag's '>' (== tag_end for an empty element)
    empty: bool
    name: bytes


@dataclass
class _Insert:
    pos: int
    seq: int
    el: etree._Element  # a new element, serialised at render time
    indent: bytes
    trail: bytes


@dataclass
class XmlDoc:
    """One document: its original bytes, its tree, and the edits made so far."""

    data: bytes
    tree: etree._ElementTree
    where: str = ""
    _elements: list[etree._Element] = field(default_factory=list)
    _index: dict[int, int] = field(default_factory=dict)
    _spans: list[_Span] = field(default_factory=list)
    _tags: dict[int, bytes] = field(default_factory=dict)  # element index -> rewritten start tag
    _inserts: list[_Insert] = field(default_factory=list)
    _deletes: list[tuple[int, int]] = field(default_factory=list)
    _seq: int = 0
    _added: dict[int, tuple[etree._Element, int]] = field(default_factory=dict)  # new element -> (it, byte offset)
    _grown: set[int] = field(default_factory=set)  # empty original elements given children
    _texted: set[int] = field(default_factory=set)  # empty original elements given text
    _texts: dict[int, str] = field(default_factory=dict)  # original elements whose text was replaced
    _touched: list[int] = field(default_factory=list)  # original byte offsets edited since take_touched()
    _newlines: list[int] = field(default_factory=list)  # byte offsets of b"\n" in data, made on first use
    quote: bytes = b"'"
    nl: bytes = b"\n"

    def __post_init__(self) -> None:
        root = self.tree.getroot()
        # strong references keep the lxml proxies (and so their ids) stable
        self._elements = [el for el in root.iter() if isinstance(el.tag, str)]
        self._index = {id(el): i for i, el in enumerate(self._elements)}
        self._spans = self._scan()
        if len(self._spans) != len(self._elements):
            raise XmlEditError(f"{self.where}: cannot map the XML text to its elements")
        for span, el in zip(self._spans, self._elements, strict=True):
            local = span.name.split(b":")[-1].decode("utf-8", "replace")
            if local != etree.QName(el).localname:
                raise XmlEditError(f"{self.where}: cannot map the XML text to its elements (<{local}>)")
        self.nl = b"\r\n" if self.data.count(b"\r\n") * 2 > self.data.count(b"\n") else b"\n"
        singles = self.data.count(b"='")
        doubles = self.data.count(b'="')
        self.quote = b'"' if doubles > singles else b"'"

    # ----------------------------------------------------------------- scanning

    def _scan(self) -> list[_Span]:
        spans: list[_Span] = []
        stack: list[int] = []
        for m in _TOKEN.finditer(self.data):
            if m.group("start") is not None:
                empty = bool(m.group("empty"))
                span = _Span(m.start(), m.end(), m.end(), m.end(), empty, m.group("start"))
                spans.append(span)
                if not empty:
                    stack.append(len(spans) - 1)
            elif m.group("end") is not None:
                if not stack:
                    raise XmlEditError(f"{self.where}: unbalanced end tag at byte {m.start()}")
                span = spans[stack.pop()]
                span.end_start, span.end = m.start(), m.end()
        if stack:
            raise XmlEditError(f"{self.where}: unclosed element")
        return spans

    def _i(self, el: etree._Element) -> int:
        try:
            return self._index[id(el)]
        except KeyError:
            raise XmlEditError(f"{self.where}: element <{el.tag}> is not part of the original document") from None

    def _line_at(self, pos: int) -> int:
        """1-based line of byte ``pos`` (a bisection: counting newlines per edit made fix quadratic)."""
        if not self._newlines:
            self._newlines = [m.start() for m in re.finditer(b"\n", self.data)] or [len(self.data)]
        return bisect.bisect_left(self._newlines, pos) + 1

    def line_of(self, el: etree._Element) -> int:
        """1-based line of ``el``'s start tag in the original bytes."""
        return self._line_at(self._spans[self._i(el)].start)

    def take_touched(self) -> list[int]:
        """1-based original lines edited since the last call (to tie reasons to diff hunks)."""
        lines = sorted({self._line_at(pos) for pos in self._touched})
        self._touched = []
        return lines

    def _start_tag(self, i: int) -> bytes:
        if i in self._tags:
            return self._tags[i]
        s = self._spans[i]
        return self.data[s.start : s.tag_end]

    def _line_indent(self, pos: int) -> bytes | None:
        """The blanks before ``pos`` on its line, or ``None`` if something else precedes it there."""
        line_start = self.data.rfind(b"\n", 0, pos) + 1
        prefix = self.data[line_start:pos]
        return None if prefix.strip() else prefix

    def _indent_at(self, pos: int) -> bytes:
        return self._line_indent(pos) or b""

    def _unit(self) -> bytes:
        """One level of indentation as the document uses it (two spaces if unknown)."""
        root_i = 0
        for i, el in enumerate(self._elements):
            if el.getparent() is self._elements[root_i]:
                ind = self._indent_at(self._spans[i].start)
                if ind:
                    return ind
                break
        return b"  "

    @staticmethod
    def _esc_text(value: str) -> bytes:
        return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").encode("utf-8")

    def _esc(self, value: str, quote: bytes) -> bytes:
        out = self._esc_text(value)
        return out.replace(b"'", b"&apos;") if quote == b"'" else out.replace(b'"', b"&quot;")

    # ----------------------------------------------------------------- editing
    #
    # Original elements are patched in the bytes. Elements kvmtune adds are kept as
    # elements and serialised at render time, so a later fixer can still edit them.

    def _new_pos(self, el: etree._Element) -> int | None:
        """For an element kvmtune added (or inside one), the byte offset where it goes."""
        node: etree._Element | None = el
        while node is not None:
            if id(node) in self._added:
                return self._added[id(node)][1]
            if id(node) in self._index:
                return None
            node = node.getparent()
        raise XmlEditError(f"{self.where}: element <{el.tag}> is not part of this document")

    def set_attr(self, el: etree._Element, name: str, value: str) -> None:
        pos = self._new_pos(el)
        if pos is not None:
            self._touched.append(pos)
            el.set(name, value)
            return
        i = self._i(el)
        self._touched.append(self._spans[i].start)
        tag = self._start_tag(i)
        key = name.encode()
        for m in _ATTR.finditer(tag):
            if m.group(2) == key:
                q = b"'" if m.group(4) is not None else b'"'
                vs, ve = (m.start(4), m.end(4)) if m.group(4) is not None else (m.start(5), m.end(5))
                self._tags[i] = tag[:vs] + self._esc(value, q) + tag[ve:]
                break
        else:
            attrs = list(_ATTR.finditer(tag))
            if attrs:
                q = b"'" if attrs[0].group(4) is not None else b'"'
                pos = attrs[-1].end()
            else:
                q = self.quote
                pos = 1 + len(self._spans[i].name)
            self._tags[i] = tag[:pos] + b" " + key + b"=" + q + self._esc(value, q) + q + tag[pos:]
        el.set(name, value)

    def del_attr(self, el: etree._Element, name: str) -> None:
        pos = self._new_pos(el)
        if pos is None:
            i = self._i(el)
            self._touched.append(self._spans[i].start)
            tag = self._start_tag(i)
            for m in _ATTR.finditer(tag):
                if m.group(2) == name.encode():
                    self._tags[i] = tag[: m.start()] + tag[m.end() :]
                    break
        else:
            self._touched.append(pos)
        if name in el.attrib:
            del el.attrib[name]

    def remove(self, el: etree._Element) -> None:
        """Remove an element; an original one goes with its line when it stands alone on it."""
        parent = el.getparent()
        if parent is None:
            raise XmlEditError(f"{self.where}: cannot remove the root element")
        pos = self._new_pos(el)
        if pos is not None:
            self._touched.append(pos)
            self._added.pop(id(el), None)
            parent.remove(el)
            return
        i = self._i(el)
        s = self._spans[i]
        start, end = s.start, s.end
        self._touched.append(start)
        line_start = self.data.rfind(b"\n", 0, start) + 1
        if not self.data[line_start:start].strip():
            nl = self.data.find(b"\n", end)
            rest_end = nl if nl >= 0 else len(self.data)
            if not self.data[end:rest_end].strip():
                # alone on its line: take the whole line with its line end
                start, end = line_start, (rest_end + 1 if nl >= 0 else rest_end)
        self._deletes.append((start, end))
        tail = el.tail
        prev = el.getprevious()
        parent.remove(el)
        # keep the tree's text content as it was (whitespace the text patch keeps)
        if tail and tail.strip():
            if prev is not None:
                prev.tail = (prev.tail or "") + tail
            else:
                parent.text = (parent.text or "") + tail

    def _serialize(self, el: etree._Element, indent: bytes, unit: bytes) -> bytes:
        q = self.quote
        out = b"<" + str(el.tag).encode()
        for k, v in el.attrib.items():
            out += b" " + str(k).encode() + b"=" + q + self._esc(str(v), q) + q
        kids = [c for c in el if isinstance(c.tag, str)]
        text = (el.text or "").strip()
        if not kids and not text:
            return out + b"/>"
        if not kids:
            return out + b">" + self._esc_text(text) + b"</" + str(el.tag).encode() + b">"
        inner = b"".join(self.nl + indent + unit + self._serialize(c, indent + unit, unit) for c in kids)
        return out + b">" + inner + self.nl + indent + b"</" + str(el.tag).encode() + b">"

    def _child_indent(self, i: int) -> bytes:
        s = self._spans[i]
        kids = [c for c in self._elements[i] if isinstance(c.tag, str) and id(c) in self._index]
        first = self._line_indent(self._spans[self._i(kids[0])].start) if kids else None
        return first if first is not None else self._indent_at(s.start) + self._unit()

    def append(self, parent: etree._Element, child: etree._Element) -> etree._Element:
        """Append ``child`` (a new element) as the last child of ``parent``."""
        if child.getparent() is not None:
            raise XmlEditError("append: the child already has a parent")
        pos = self._new_pos(parent)
        if pos is not None:
            self._touched.append(pos)
            parent.append(child)
            return child
        i = self._i(parent)
        s = self._spans[i]
        if s.empty:
            # <parent .../> grows into <parent ...>children</parent> at render time
            self._touched.append(s.start)
            self._grown.add(i)
            self._added[id(child)] = (child, s.start)
        else:
            inner = self.data[s.tag_end : s.end_start]
            pos = s.tag_end + len(inner.rstrip())
            self._touched.append(s.end_start)
            self._seq += 1
            trail = b"" if inner.strip() or b"\n" in inner else self.nl + self._indent_at(s.start)
            self._inserts.append(_Insert(pos, self._seq, child, self._child_indent(i), trail))
            self._added[id(child)] = (child, pos)
        parent.append(child)
        return child

    def insert_after(self, sibling: etree._Element, child: etree._Element) -> etree._Element:
        """Insert ``child`` (a new element) right after the original element ``sibling``, on its own line."""
        i = self._i(sibling)
        s = self._spans[i]
        self._touched.append(s.end)
        self._seq += 1
        self._inserts.append(_Insert(s.end, self._seq, child, self._indent_at(s.start), b""))
        # an earlier insert after the same sibling comes first in the text: keep the tree in that order too
        last = sibling
        while (after := last.getnext()) is not None and self._added.get(id(after), (None, -1))[1] == s.end:
            last = after
        self._added[id(child)] = (child, s.end)
        last.addnext(child)
        return child

    def set_text(self, el: etree._Element, text: str) -> None:
        if any(isinstance(c.tag, str) for c in el):
            raise XmlEditError(f"{self.where}: set_text on <{el.tag}>, which has children")
        pos = self._new_pos(el)
        if pos is not None:
            self._touched.append(pos)
            el.text = text
            return
        i = self._i(el)
        s = self._spans[i]
        self._touched.append(s.start)
        el.text = text
        if s.empty:
            self._texted.add(i)
            return
        if i in self._texts:
            self._texts[i] = text
            return
        self._texts[i] = text
        self._deletes.append((s.tag_end, s.end_start))

    @property
    def changed(self) -> bool:
        return bool(self._tags or self._inserts or self._deletes or self._grown or self._texted)

    # ----------------------------------------------------------------- output

    def render(self) -> bytes:
        """The patched bytes; checked to mean the same document as the edited tree."""
        unit = self._unit()
        ops: list[tuple[int, int, int, bytes]] = []  # (start, end, seq, replacement)
        deleted = sorted(self._deletes)
        text_spans = {(self._spans[i].tag_end, self._spans[i].end_start) for i in self._texts}
        gone = [(a, b) for a, b in deleted if (a, b) not in text_spans]
        for i in sorted(set(self._tags) | self._grown | self._texted):
            s = self._spans[i]
            if any(a <= s.start and s.tag_end <= b for a, b in gone):
                continue
            tag = self._start_tag(i)
            el = self._elements[i]
            kids = [c for c in el if isinstance(c.tag, str)]
            if i in self._grown and kids:
                c_indent = self._indent_at(s.start) + unit
                body = b"".join(self.nl + c_indent + self._serialize(c, c_indent, unit) for c in kids)
                tag = tag.rstrip()[:-2].rstrip() + b">" + body + self.nl + self._indent_at(s.start) + b"</" + s.name + b">"
            elif i in self._texted:
                tag = tag.rstrip()[:-2].rstrip() + b">" + self._esc_text(el.text or "") + b"</" + s.name + b">"
            ops.append((s.start, s.tag_end, 0, tag))
        for a, b in deleted:
            ops.append((a, b, 0, b""))
        for i, text in self._texts.items():
            ops.append((self._spans[i].tag_end, self._spans[i].tag_end, 0, self._esc_text(text)))
        root = self.tree.getroot()
        for ins in self._inserts:
            if not self._attached(ins.el, root):
                continue  # removed again, or inside something removed
            pos = ins.pos
            moved = True
            while moved:  # its anchor line was removed: go to the end of the line before it
                moved = False
                for a, b in gone:
                    if a < pos < b:
                        pos = a - 2 if self.data[a - 2 : a] == b"\r\n" else a - 1 if self.data[a - 1 : a] == b"\n" else a
                        moved = True
            body = self.nl + ins.indent + self._serialize(ins.el, ins.indent, unit) + ins.trail
            ops.append((pos, pos, ins.seq, body))
        ops.sort(key=lambda o: (o[0], 0 if o[1] == o[0] else 1, o[2]))
        out = bytearray()
        pos = 0
        for start, end, _seq, chunk in ops:
            if start < pos:
                if end <= pos:
                    continue  # inside an already removed range
                raise XmlEditError(f"{self.where}: overlapping edits")
            out += self.data[pos:start]
            out += chunk
            pos = max(pos, end)
        out += self.data[pos:]
        result = bytes(out)
        self._check(result)
        return result

    @staticmethod
    def _attached(el: etree._Element, root: etree._Element) -> bool:
        node: etree._Element | None = el
        while node is not None:
            if node is root:
                return True
            node = node.getparent()
        return False

    def _check(self, result: bytes) -> None:
        try:
            reparsed = etree.fromstring(result, etree.XMLParser(resolve_entities=False, no_network=True))
        except etree.XMLSyntaxError as exc:
            raise XmlEditError(f"{self.where}: the edited XML does not parse ({exc.msg})") from None
        if _canon(reparsed) != _canon(self.tree.getroot()):
            raise XmlEditError(f"{self.where}: the text patch and the tree edit disagree (a kvmtune bug)")


def _canon(root: etree._Element) -> bytes:
    copy = etree.fromstring(etree.tostring(root))
    for el in copy.iter():
        if el.text is not None and not el.text.strip():
            el.text = None
        if el.tail is not None and not el.tail.strip():
            el.tail = None
    return etree.tostring(copy, method="c14n")
