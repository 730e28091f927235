"""Text for a terminal from values others wrote (QEMU ``-name``, domain names, file names, image headers).

A control character reaching root's terminal can set its title (OSC), clear the screen, move the cursor
over a line already printed, or start a fake line ("0 findings"). Every text output passes such values
through :func:`safe` (one line: newlines too are shown as escapes) or :func:`safe_block` (kvmtune's own
multi-line text that embeds them: its newlines and tabs are kept). HTML pages pass them through
:func:`html_safe`: HTML escaping alone would leave the control characters in the page (a browser shows
some, hides others, and a bidi override reorders the text around it), so they are shown as the same
escapes. JSON and SARIF escape by their own rules and do not use this.
"""

from __future__ import annotations

import re

# C0 and C1 controls, DEL, and the Unicode line/paragraph separators and bidirectional overrides
# (which reorder what the terminal shows: "Trojan Source", CVE-2021-42574).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_UNSAFE_IN_BLOCK = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    code = ord(m.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(value: object) -> str:
    """``value`` as one printable line: every control character becomes a visible ``\\xNN`` escape."""
    return _UNSAFE.sub(_escape, str(value))


def safe_block(text: str) -> str:
    """Like :func:`safe`, keeping newlines and tabs (for multi-line text kvmtune composed itself)."""
    return _UNSAFE_IN_BLOCK.sub(_escape, text)


def html_safe(value: object) -> str:
    """``value`` for HTML text or a quoted attribute: :func:`safe`, then ``&<>"'`` escaped."""
    import html  # here: html.entities is a large table, and every start imports this module

    return html.escape(safe(value))
