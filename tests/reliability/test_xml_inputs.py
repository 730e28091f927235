"""fix handles UTF-16 XML as audit does; libxml2's messages reach the user as one clean line."""

from __future__ import annotations

from pathlib import Path

import pytest
from reliability_helpers import domain_xml

from kvmtune.cli import main
from kvmtune.fix.journal import list_journals

DOMAIN = '<?xml version="1.0" encoding="UTF-16"?>\n' + domain_xml("u16")

ENCODINGS = {
    "le-bom": lambda t: b"\xff\xfe" + t.encode("utf-16-le"),
    "be-bom": lambda t: b"\xfe\xff" + t.encode("utf-16-be"),
    "le-no-bom": lambda t: t.encode("utf-16-le"),
}


@pytest.mark.parametrize("kind", list(ENCODINGS))
def test_fix_edits_utf16_and_keeps_its_encoding(tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    xml, journal = tmp_path / "u16.xml", tmp_path / "j"
    original = ENCODINGS[kind](DOMAIN)
    xml.write_bytes(original)
    main(["audit", str(xml)])
    assert "KVM-STO-002" in capsys.readouterr().out
    assert main(["fix", str(xml)]) == 0
    out = capsys.readouterr().out
    assert "-      <driver name='qemu' type='raw' cache='writethrough'/>" in out
    assert "+      <driver name='qemu' type='raw' cache='none' io='native'/>" in out
    assert main(["fix", str(xml), "--apply", "--yes", "--journal-dir", str(journal)]) == 0
    capsys.readouterr()
    fixed = xml.read_bytes()
    twin = tmp_path / "utf8.xml"  # the same domain in UTF-8, fixed the ordinary way
    twin.write_text(DOMAIN.replace('encoding="UTF-16"', 'encoding="UTF-8"'))
    assert main(["fix", str(twin), "--apply", "--yes", "--journal-dir", str(tmp_path / "j8")]) == 0
    capsys.readouterr()
    expected = twin.read_text().replace('encoding="UTF-8"', 'encoding="UTF-16"')
    assert fixed == ENCODINGS[kind](expected), "encoding, byte order mark and declaration stay; only the fix differs"
    main(["audit", str(xml)])
    assert "KVM-STO-002" not in capsys.readouterr().out
    (jid,) = [j for j, _, _ in list_journals(journal)]
    assert main(["undo", jid, "--yes", "--journal-dir", str(journal)]) == 0
    assert xml.read_bytes() == original


@pytest.mark.parametrize(
    "content, expect",
    [
        (b"<domain>" + b"<a>" * 300 + b"</a>" * 300 + b"</domain>", "elements nested deeper than 256 levels"),
        ("<domain type='kvm'><name>caf\xe9</name></domain>".encode("latin-1"), "not UTF-8 text (byte 0xE9)"),
    ],
    ids=["deep", "latin-1"],
)
@pytest.mark.parametrize("command", ["audit", "fix"])
def test_libxml2_errors_are_one_clean_line(tmp_path: Path, content: bytes, expect: str, command: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.xml"
    bad.write_bytes(content)
    assert main([command, str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(bad) in err and expect in err
    assert "XML_PARSE_HUGE" not in err and "\\x0a" not in err and "Bytes:" not in err
