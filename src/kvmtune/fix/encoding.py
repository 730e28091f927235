"""UTF-16 domain XML for the byte-preserving editor.

``audit`` reads UTF-16 files (lxml detects the encoding from the byte order mark or
the first characters), but :class:`kvmtune.fix.xmldoc.XmlDoc` patches bytes and
its tokenizer reads ASCII-compatible text. A UTF-16 file is therefore edited as
UTF-8 (its declaration saying so for the parser) and written back in its own
encoding: the same byte order, with or without its byte order mark, and its own
declaration, so everything the fix does not touch stays as it was.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_DECL = re.compile(r"""^(\ufeff?<\?xml[^>]*?encoding\s*=\s*)(["'])([^"']*)\2""")
_KINDS = (
    (b"\xff\xfe", "utf-16-le", True),
    (b"\xfe\xff", "utf-16-be", True),
    (b"<\x00", "utf-16-le", False),
    (b"\x00<", "utf-16-be", False),
)


@dataclass(frozen=True)
class Utf16:
    codec: str
    bom: bytes
    declared: str | None  # the encoding name in the XML declaration, if any

    def to_utf8(self, data: bytes) -> bytes:
        text = data[len(self.bom) :].decode(self.codec)
        return _DECL.sub(lambda m: f"{m.group(1)}{m.group(2)}UTF-8{m.group(2)}", text, count=1).encode("utf-8")

    def back(self, data: bytes) -> bytes:
        text = data.decode("utf-8")
        if self.declared is not None:
            name = self.declared
            text = _DECL.sub(lambda m: f"{m.group(1)}{m.group(2)}{name}{m.group(2)}", text, count=1)
        return self.bom + text.encode(self.codec)


def utf16_of(data: bytes) -> Utf16 | None:
    """How ``data`` is UTF-16 encoded, or None for UTF-8/ASCII-compatible text."""
    for start, codec, has_bom in _KINDS:
        if data.startswith(start):
            bom = start if has_bom else b""
            try:
                text = data[len(bom) :].decode(codec)
            except UnicodeDecodeError:
                return None
            m = _DECL.match(text)
            return Utf16(codec, bom, m.group(3) if m else None)
    return None


def decode_text(data: bytes) -> str:
    """Text of a file for showing it (diffs): UTF-16 by its marks, otherwise UTF-8 (undecodable bytes replaced)."""
    kind = utf16_of(data)
    if kind is not None:
        return data[len(kind.bom) :].decode(kind.codec, "replace")
    return data.decode("utf-8", "replace")
