"""What to audit is plain data (``audit/collect.py``'s ``Sources``), read by one ``gather`` that ``audit`` and
``verify`` share; neither command imports the other, and nothing rewrites the parsed arguments (issue 30)."""

from __future__ import annotations

import sys
from pathlib import Path

from kvmtune.audit.collect import EXAMPLES, Sources, domain_files_among_images, gather
from kvmtune.audit.context import AuditContext
from kvmtune.host.root import HostRoot

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "architecture"))
from test_imports import import_graph  # noqa: E402


def test_domain_files_among_images_returns_new_lists_and_leaves_its_inputs(tmp_path: Path) -> None:
    (tmp_path / "dir.xml").mkdir()  # a directory named .xml stays an image directory
    paths, images = ["a.xml"], ["disk.qcow2", "vm.XML", str(tmp_path / "dir.xml")]
    new_paths, new_images, moved = domain_files_among_images(paths, images)
    assert (new_paths, new_images, moved) == (["a.xml", "vm.XML"], ["disk.qcow2", str(tmp_path / "dir.xml")], ["vm.XML"])
    assert paths == ["a.xml"] and images == ["disk.qcow2", "vm.XML", str(tmp_path / "dir.xml")]


def test_gather_reads_what_the_sources_name_and_nothing_else() -> None:
    ctx = AuditContext(host=HostRoot(str(HOSTS / "ksm-overcommit")))
    result = gather(Sources(examples=True, guest_images=False), ctx)
    assert {g.name for g in result.guests} >= {"web01-legacy"}
    assert not result.host_audited  # a named input: the host is not added
    assert result.images == []
    assert len(result.guests) == len(list(EXAMPLES.glob("*.xml")))


def test_no_sources_is_the_hosts_default_audit() -> None:
    ctx = AuditContext(host=HostRoot(str(HOSTS / "ksm-overcommit")))
    assert not Sources().explicit
    result = gather(Sources(guest_images=False), ctx)
    assert result.host_audited
    assert any(g.name == "web03" for g in result.guests)  # the captured tree's running guests


def test_verify_and_fix_take_their_inputs_from_audit_collect_not_from_the_audit_command() -> None:
    graph = import_graph()
    for command in ("kvmtune.cli.verify", "kvmtune.cli.fix"):
        assert "kvmtune.cli.audit" not in graph[command], command
        assert "kvmtune.audit.collect" in graph[command], command
