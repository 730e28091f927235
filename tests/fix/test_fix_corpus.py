"""Every domain of the shared libvirt corpus: fixing (bus changes allowed) never crashes, the
edited text means the edited tree (checked inside XmlDoc), every fixed finding is gone, a second
fix plans nothing, and a file libvirt's schema accepted is still accepted afterwards."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from fixhelpers import FIXTURE_HOST
from lxml import etree

from kvmtune.audit.engine import select_rules
from kvmtune.errors import InputError
from kvmtune.fix.domains import fix_guest
from kvmtune.fix.registry import FixOptions
from kvmtune.host.root import HostRoot

SCHEMA = Path("/usr/share/libvirt/schemas/domain.rng")


def fixed_corpus(corpus: Path) -> list[tuple[Path, bytes, bytes]]:
    rules = select_rules()
    options = FixOptions(allow_bus_change=True, allow_cpu_change=True, assume_this_host=True, host=HostRoot(str(FIXTURE_HOST)))
    out = []
    for f in sorted((corpus / "domains").glob("*.xml")):
        data = f.read_bytes()
        try:
            _guest, result = fix_guest(data, str(f), "xml", rules, options)
        except InputError:
            continue  # the auditor rejects it too (tested there)
        # a fixer whose change leaves its finding is dropped from the plan, not raised: catch it here
        assert not [s for s in result.skipped if "did not remove" in s], f
        if result.after is not None:
            out.append((f, data, result.after))
    return out


@pytest.fixture(scope="module")
def fixed(request: pytest.FixtureRequest) -> list[tuple[Path, bytes, bytes]]:
    corpus = request.getfixturevalue("corpus")
    return fixed_corpus(corpus)


@pytest.fixture(scope="module")
def corpus() -> Path:
    from fixhelpers import REPO

    path = REPO.parent / "shared" / "corpus" / "libvirt"
    if not path.is_dir():
        pytest.skip(f"corpus not found at {path}")
    return path


def test_corpus_fix_is_idempotent(fixed: list[tuple[Path, bytes, bytes]]) -> None:
    assert len(fixed) > 1000
    rules = select_rules()
    options = FixOptions(allow_bus_change=True, allow_cpu_change=True, assume_this_host=True, host=HostRoot(str(FIXTURE_HOST)))
    for f, _before, after in fixed:
        assert fix_guest(after, str(f), "xml", rules, options)[1].after is None, f


def test_corpus_fix_keeps_schema_validity(fixed: list[tuple[Path, bytes, bytes]]) -> None:
    if not SCHEMA.is_file():
        pytest.skip("libvirt's RelaxNG schemas are not installed")
    rng = etree.RelaxNG(etree.parse(str(SCHEMA)))
    checked = 0
    for f, before, after in fixed:
        if not rng.validate(etree.fromstring(before)):
            continue
        checked += 1
        assert rng.validate(etree.fromstring(after)), f"{f.name}: {rng.error_log.last_error}"
    assert checked > 800


@pytest.mark.integration
def test_libvirt_accepts_fixed_corpus_domains(fixed: list[tuple[Path, bytes, bytes]], libvirt_uri: str) -> None:
    """A sample of x86 corpus domains libvirt defines as they are: it defines them fixed too."""
    import libvirt

    conn = libvirt.open(libvirt_uri)
    tag = uuid.uuid4().hex[:8]

    def try_define(data: bytes, name: str) -> str | None:
        root = etree.fromstring(data)
        name_el = root.find("name")
        assert name_el is not None
        name_el.text = name
        for u in root.findall("uuid"):
            root.remove(u)
        try:
            dom: Any = conn.defineXML(etree.tostring(root).decode())
        except libvirt.libvirtError as exc:
            return str(exc).splitlines()[0]
        dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
        return None

    accepted = 0
    try:
        for n, (f, before, after) in enumerate(fixed):
            if accepted >= 40:
                break
            name = f"kvmtune-test-{tag}-corpus{n}"
            if try_define(before, name) is not None:
                continue
            accepted += 1
            assert try_define(after, name) is None, f.name
    finally:
        conn.close()
    assert accepted >= 20
