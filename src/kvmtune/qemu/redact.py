"""Secrets out of a QEMU command line, by parsing each option the way QEMU does (not by patterns).

A captured tree is meant for bug reports, so every value QEMU treats as a secret goes, in every
syntax QEMU accepts (``docs/system/secrets.rst``, ``qapi/block-core.json``, ``qapi/crypto.json``):

- ``key=value,…`` option strings (QemuOpts/keyval), where ``,,`` is a literal comma inside a value;
- JSON option values (``-object {"qom-type":"secret",…}``, ``-blockdev {…}``) and ``json:{…}`` filenames;
- URLs with a ``user:password@`` part (http, https, ftp, ssh, nbd, gluster, …) and iSCSI's CHAP form
  ``iscsi://user%password@host/iqn/lun``;
- keys whose value is the secret itself: ``data`` (``-object secret``), ``password``, ``passwd``,
  ``secret``, ``key``, ``iv``, ``token``, ``cookie`` (``file.cookie``), ``psk``.

Keys that only *name* a secret object (``password-secret``, ``key-secret``, ``cookie-secret``) are kept:
they say which object holds the secret and are not secret themselves.
"""

from __future__ import annotations

import json
import re
from typing import Any

REDACTED = "REDACTED"
SECRET_KEYS = frozenset({"data", "password", "passwd", "secret", "key", "iv", "token", "cookie", "psk"})
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^@/?#\s]*)@")


def _secret_key(key: str) -> bool:
    return key.rsplit(".", 1)[-1].strip().lower() in SECRET_KEYS


def split_opts(text: str) -> list[str]:
    """``a=b,c=d,,e`` → ``["a=b", "c=d,e"]``: QemuOpts' own splitting (``,,`` is a comma)."""
    parts: list[str] = []
    cur: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == ",":
            if text[i + 1 : i + 2] == ",":
                cur.append(",")
                i += 2
                continue
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    parts.append("".join(cur))
    return parts


def join_opts(parts: list[str]) -> str:
    return ",".join(p.replace(",", ",,") for p in parts)


def redact_url(value: str) -> tuple[str, int]:
    """Drop the password of every ``scheme://user:password@`` in ``value`` (and iSCSI's ``user%password@``),
    wherever it stands (a ``guestfwd=…cmd:curl URL`` holds one mid-value)."""
    count = 0

    def one(m: re.Match[str]) -> str:
        nonlocal count
        userinfo = m.group("userinfo")
        sep = "%" if m.group("scheme").lower().startswith("iscsi") and "%" in userinfo else ":"
        if sep not in userinfo:
            return m.group(0)
        count += 1
        return f"{m.group('scheme')}{userinfo.split(sep, 1)[0]}{sep}{REDACTED}@"

    return _URL_CREDENTIALS.sub(one, value), count


def _redact_json(node: Any) -> tuple[Any, int]:
    if isinstance(node, dict):
        count = 0
        out: dict[str, Any] = {}
        for k, v in node.items():
            if _secret_key(str(k)) and v is not None and not isinstance(v, (dict, list)):
                out[k] = REDACTED
                count += 1
            else:
                out[k], n = _redact_json(v)
                count += n
        return out, count
    if isinstance(node, list):
        items = [_redact_json(v) for v in node]
        return [v for v, _ in items], sum(n for _, n in items)
    if isinstance(node, str):
        return redact_value(node)
    return node, 0


def redact_value(value: str) -> tuple[str, int]:
    """A single value: a ``json:`` filename, a URL, or plain text."""
    if value.startswith("json:"):
        new, n = redact_json_text(value[5:])
        return "json:" + new, n
    return redact_url(value)


def redact_json_text(text: str) -> tuple[str, int]:
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return REDACTED, 1  # unparsable: nothing of it can be shown safely
    new, n = _redact_json(doc)
    return json.dumps(new, separators=(",", ":")), n


def redact_arg(arg: str) -> tuple[str, int]:
    """One argv element: a JSON option, a ``key=value,…`` option string, or a bare value."""
    stripped = arg.lstrip()
    if stripped.startswith("{"):
        return redact_json_text(arg)
    if arg.startswith("-") or "=" not in arg:
        return redact_value(arg)
    count = 0
    parts = split_opts(arg)
    for i, part in enumerate(parts):
        key, eq, value = part.partition("=")
        if not eq and i and any(q in part for q in "\"'{}"):
            # a JSON value written with single commas was cut apart: none of its pieces is shown
            new, n = REDACTED, 1
        elif not eq:
            new, n = redact_value(part)
        elif _secret_key(key):
            new, n = f"{key}={REDACTED}", 1
        elif "://" in key:  # a bare URL whose password holds '='
            new, n = redact_url(part)
        else:
            v, n = redact_value(value)
            new = f"{key}={v}"
        parts[i] = new
        count += n
    return (join_opts(parts), count) if count else (arg, 0)


def redact_argv(argv: list[str]) -> tuple[list[str], int]:
    out: list[str] = []
    count = 0
    for arg in argv:
        new, n = redact_arg(arg)
        out.append(new)
        count += n
    return out, count


def redact_cmdline(data: bytes) -> tuple[bytes, int]:
    """A ``/proc/<pid>/cmdline`` (NUL-separated) with every secret blanked, parsed option by option."""
    from kvmtune.qemu.argv import split_proc_cmdline

    out, count = redact_argv(split_proc_cmdline(data))
    return b"\0".join(a.encode("utf-8", "surrogateescape") for a in out) + b"\0", count
