"""libvirt's own test corpus: every file is audited or rejected with one line, never a traceback."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.cli import main
from kvmtune.domain.xml import load_guest_file
from kvmtune.errors import InputError
from kvmtune.host.root import HostRoot
from kvmtune.qemu.cmdline import guest_from_text

FIXTURE_HOST = Path(__file__).parent.parent / "fixtures" / "hosts" / "rules-default"


def accepted_by_libvirt(corpus: Path) -> set[str]:
    with open(corpus / "manifest.tsv", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    return {
        r["name"]
        for r in rows
        if {"ok", "cmdline-failure"} & set(r["libvirt_test_expectations"].replace(",", " ").split())
    }


def test_every_corpus_domain_is_audited_or_rejected_in_one_line(corpus: Path) -> None:
    accepted = accepted_by_libvirt(corpus)
    ctx = AuditContext(host=HostRoot(str(FIXTURE_HOST)))
    rejected: dict[str, str] = {}
    audited = 0
    files = sorted((corpus / "domains").glob("*.xml"))
    assert len(files) == 1208
    for f in files:
        try:
            guest = load_guest_file(f)
        except InputError as exc:
            assert "\n" not in str(exc) and str(f) in str(exc)
            rejected[f.stem] = str(exc)
            continue
        run_rules(ctx, [guest])
        audited += 1
    wrongly = sorted(set(rejected) & accepted)
    assert not wrongly, f"rejected although libvirt accepts them: {[rejected[n] for n in wrongly]}"
    assert "broken-xml-invalid" in rejected
    assert audited >= 1200


def test_every_corpus_command_line_is_audited(corpus: Path) -> None:
    ctx = AuditContext(host=HostRoot(str(FIXTURE_HOST)))
    files = sorted((corpus / "args").glob("*.args"))
    assert len(files) == 782
    for f in files:
        guest = guest_from_text(f.read_text(), str(f))
        assert guest.name != "?", f
        run_rules(ctx, [guest])


def test_xml_and_cmdline_agree_on_disks(corpus: Path) -> None:
    """The cache mode libvirt wrote into the command line is the one the XML asked for."""
    xml = load_guest_file(corpus / "domains" / "disk-cache.xml")
    cmd = guest_from_text((corpus / "args" / "disk-cache.args").read_text(), "disk-cache.args")
    assert [d.cache for d in xml.disks] == [d.cache for d in cmd.disks] == [
        "writeback", "unsafe", "none", "writethrough", "directsync"]
    assert [d.bus for d in xml.disks] == [d.bus for d in cmd.disks]


def test_cli_over_whole_corpus_reports_rejects_and_exits_2(
    corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["audit", "--root", str(FIXTURE_HOST), "--format", "json", str(corpus / "domains")])
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert code == 2
    assert doc["summary"]["findings"] > 300
    assert doc["errors"] and all("\n" not in e for e in doc["errors"])
    assert any("broken-xml-invalid.xml" in line for line in err.splitlines())
    assert "Traceback" not in err


def test_xml_and_its_command_line_resolve_to_the_same_disks(corpus: Path) -> None:
    """libvirt's XML is the intent, its -blockdev command line the generated form: the model agrees."""
    compared = 0
    for args in sorted((corpus / "args").glob("*.args")):
        xml = corpus / "domains" / f"{args.stem}.xml"
        if not xml.exists():
            continue
        try:
            gx = load_guest_file(xml)
        except InputError:
            continue
        ga = guest_from_text(args.read_text(), str(args))
        sources = [d.source for d in ga.disks if d.device in ("disk", "lun") and d.source]
        by_source = {d.source: d for d in ga.disks if d.source and sources.count(d.source) == 1}
        for d in gx.disks:
            other = by_source.get(d.source)
            if d.device not in ("disk", "lun") or other is None or d.source_type in ("volume", "vhostuser"):
                continue
            if d.cache not in (None, "default"):
                assert other.cache == d.cache, (args.stem, d.target)
            if d.format is not None and not (other.format == "luks" and d.format == "raw"):  # raw + <encryption>
                assert other.format == d.format, (args.stem, d.target)
            assert (other.discard == "unmap") == (d.discard == "unmap"), (args.stem, d.target)
            assert other.source_type == d.source_type, (args.stem, d.target)
            compared += 1
    assert compared >= 400
