"""Against a real libvirtd: domains defined from fixtures give the same findings through
``--connect`` as from their files."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from lxml import etree

from kvmtune.cli import main

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "src" / "kvmtune" / "examples").glob("*.xml"))
# rules that read more of the definition than the guest model holds (the CPU layout, a Windows guest's
# Hyper-V and clock elements): they must judge a libvirt domain as they judge its file
DEEP = [p for rule in ("KVM-CPU-021", "KVM-WIN-001", "KVM-WIN-003")
        for p in sorted((REPO / "tests" / "rules" / rule / "bad").glob("*.xml"))]


def _key(f: dict[str, object]) -> tuple[str, str, str, str]:
    target = f["target"]
    assert isinstance(target, dict)
    return (str(target["domain"]), str(f["rule"]), str(target["device"]), str(f["actual"]))


@pytest.fixture
def defined(libvirt_uri: str, tmp_path: Path) -> Iterator[tuple[list[Path], list[str]]]:
    """Define every example under a unique name; undefine afterwards."""
    import libvirt

    conn = libvirt.open(libvirt_uri)
    tag = uuid.uuid4().hex[:8]
    files: list[Path] = []
    names: list[str] = []
    doms = []
    try:
        for src in EXAMPLES + DEEP:
            tree = etree.parse(str(src))
            name_el = tree.getroot().find("name")
            assert name_el is not None
            name_el.text = f"kvmtune-test-{tag}-{name_el.text}"
            for uuid_el in tree.getroot().findall("uuid"):  # libvirt gives each its own; fixtures may share one
                tree.getroot().remove(uuid_el)
            for os_type in tree.getroot().findall("os/type"):  # this host's QEMU may predate the fixture's machine
                if src in DEEP and os_type.get("machine"):
                    os_type.set("machine", "q35" if "q35" in os_type.get("machine", "") else "pc")
            out = tmp_path / src.name
            tree.write(str(out))
            doms.append(conn.defineXML(out.read_text()))
            files.append(out)
            names.append(name_el.text)
        yield files, names
    finally:
        for d in doms:
            d.undefine()
        conn.close()


def test_connect_and_files_give_the_same_findings(
    libvirt_uri: str, defined: tuple[list[Path], list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    files, names = defined
    # the files are the definitions of this host's domains: say so, for the host-relative rules
    assert main(["audit", "--format", "json", "--assume-this-host", *map(str, files)]) == 0
    from_files = {_key(f) for f in json.loads(capsys.readouterr().out)["findings"]}
    assert main(["audit", "--format", "json", "--connect", libvirt_uri]) == 0
    doc = json.loads(capsys.readouterr().out)
    from_libvirt = {_key(f) for f in doc["findings"] if f["target"]["domain"] in names}
    assert from_files, "the examples should produce findings"
    assert {"KVM-CPU-021", "KVM-WIN-001", "KVM-WIN-003"} <= {k[1] for k in from_libvirt}
    assert from_libvirt == from_files
    assert any(f"libvirt {libvirt_uri}:" in line for line in doc["looked_at"])


def test_default_audit_uses_libvirt_when_it_answers(
    libvirt_uri: str, defined: tuple[list[Path], list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "--format", "json"]) in (0, 2)
    doc = json.loads(capsys.readouterr().out)
    assert any(line.startswith(f"libvirt {libvirt_uri}:") for line in doc["looked_at"])
    domains = {f["target"]["domain"] for f in doc["findings"]}
    assert set(defined[1]) & domains


def test_domain_names_the_libvirt_domains_audited(
    libvirt_uri: str, defined: tuple[list[Path], list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 32 item 18: `audit --domain NAME` (repeatable, globs) keeps to those domains of the URI."""
    _files, names = defined
    tag = names[0].split("-")[2]
    one, glob = names[0], f"kvmtune-test-{tag}-*"
    assert main(["audit", "--format", "json", "--connect", libvirt_uri, "--domain", one]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {f["target"]["domain"] for f in doc["findings"]} == {one}
    assert main(["audit", "--format", "json", "--connect", libvirt_uri, "--domain", glob]) == 0
    doc = json.loads(capsys.readouterr().out)
    seen = {f["target"]["domain"] for f in doc["findings"]}
    assert seen <= set(names) and len(seen) > 1  # this test's domains, not the others libvirt holds
    assert any(f"libvirt {libvirt_uri}: {len(names)} domain(s)" in line for line in doc["looked_at"])
    # a pattern that matches nothing is one line, exit 2, the rest still reported
    code = main(["audit", "--connect", libvirt_uri, "--domain", one, "--domain", "no-such-*"])
    captured = capsys.readouterr()
    assert code == 2 and f"--domain no-such-*: no domain of {libvirt_uri} matches" in captured.err
