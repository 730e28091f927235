"""Typed journal entries: every kind round-trips through JSON, malformed ones are refused with one
line, and a journal written in the pre-typed shape (format 1, hand-written here) is still undone."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kvmtune.cli import main
from kvmtune.fix.effect import Planned
from kvmtune.fix.entries import (
    DomainEntry,
    FileEntry,
    ImageEntry,
    LiveEntry,
    Restore,
    RuntimeEntry,
    entry_from_json,
)

_DOM = {"kind": "domain", "uri": "u", "name": "n", "uuid": "u", "status": "done", "prior_xml": "<d/>"}
_ITEM = {"guest": "g", "rule": "r", "target": "t", "what": "w", "takes_effect": "live"}
_LIVE = {"kind": "live", "uri": "u", "name": "n", "uuid": "u", "status": "done", "setting": "memory-stats-period",
         "prior": 0, "new": 10, "domain_id": 7}

ENTRIES = [
    FileEntry(what="rewrite /etc/x", path="/t/etc/x", shown="/etc/x", prior=b"old\n", prior_mode=0o644,
              prior_uid=0, prior_gid=0, after_sha256="ab" * 32, temp="/t/etc/.x.tmp", created_dirs=["/t/etc"]),
    FileEntry(what="create /etc/y", path="/t/etc/y", shown="/etc/y", prior=None, temp="/t/etc/.y.tmp",
              status="done"),
    RuntimeEntry(what="write /proc/sys/vm/swappiness", path="/proc/sys/vm/swappiness", real_path="/t/proc/sys/vm/sw",
                 prior="60", new="10", restore=[Restore("/t/proc/sys/vm/sw", "60", "/proc/sys/vm/swappiness")],
                 tree_prior=b"60\n", status="failed", error="cannot write"),
    DomainEntry(what="domain a: redefine", uri="test:///default", name="a", uuid="u", prior_xml="<domain/>",
                new_xml="<domain>x</domain>", after_xml="<domain>x</domain>", was_active=True),
    ImageEntry(what="image /i", path="/i", format="qcow2", options="preallocation=metadata", backup="/i.orig",
               temp="/.i.tmp", prior_ino=12, prior_size=4096, after_ino=13, purged=True),
    DomainEntry(what="domain b: redefine", uri="test:///default", name="b", uuid="u2", prior_xml="<domain/>",
                new_xml="<domain>y</domain>", was_active=True, takes_effect="restart",
                planned=[Planned("b", "KVM-STO-004", "disk:vda", "cache → none", "restart")]),
    LiveEntry(what="domain c: set live", uri="qemu:///system", name="c", uuid="u3", setting="memory-stats-period",
              prior=0, new=10, domain_id=4, status="done", takes_effect="live",
              planned=[Planned("c", "KVM-MEM-013", "memballoon", "stats period → 10 s", "live")]),
]


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: f"{e.kind}-{e.status}")
def test_round_trip(entry: object) -> None:
    assert isinstance(entry, FileEntry | RuntimeEntry | DomainEntry | ImageEntry | LiveEntry)
    doc = json.loads(json.dumps(entry.to_json()))
    assert entry_from_json(doc, 1) == entry


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ([], "change 3 is not an object"),
        ({"kind": "rm -rf"}, "unknown kind 'rm -rf'"),
        ({"kind": "file", "path": "/x", "temp": "/.x", "status": "done"}, "change 3 (file) has no prior content"),
        ({"kind": "file", "path": "/x", "temp": "/.x", "status": "done", "prior_b64": "***"}, "undecodable"),
        ({"kind": "file", "path": "/x", "temp": "/.x", "status": "maybe", "prior_b64": None}, "unknown status"),
        ({"kind": "runtime", "path": "/p", "real_path": "/p", "prior": "1", "new": "2", "status": "done",
          "restore": 5}, "bad restore list"),
        ({"kind": "image", "path": "/i", "backup": "/b", "temp": "/t", "status": "done", "after_ino": "7"},
         "non-integer 'after_ino'"),
        ({"kind": "domain", "uri": "u", "name": "n", "status": "done", "prior_xml": "<d/>"}, "no 'uuid' string"),
        # takes_effect and planned: optional, but one of the five words and well-formed items when there
        ({**_DOM, "takes_effect": "soon"}, "change 3 (domain) has unknown takes_effect 'soon'"),
        ({**_DOM, "takes_effect": ["live"]}, "unknown takes_effect"),
        ({**_DOM, "takes_effect": "live\n"}, "unknown takes_effect"),
        ({**_DOM, "takes_effect": "LIVE"}, "unknown takes_effect"),
        ({**_DOM, "takes_effect": "live", "planned": {"guest": "g"}}, "bad 'planned'"),
        ({**_DOM, "takes_effect": "live", "planned": [{"guest": "g", "rule": "r", "target": "t", "what": "w"}]},
         "bad 'planned'"),
        ({**_DOM, "takes_effect": "live", "planned": [{**_ITEM, "extra": "x"}]}, "bad 'planned'"),
        ({**_DOM, "takes_effect": "live", "planned": [{**_ITEM, "rule": 7}]}, "bad 'planned'"),
        ({**_DOM, "takes_effect": "live", "planned": [{**_ITEM, "takes_effect": "later"}]},
         "in 'planned' unknown takes_effect 'later'"),
        # a live change: only a setting kvmtune sets live, with values libvirt's int holds
        ({**_LIVE, "setting": "vcpu-pin"}, "change 3 (live) has unknown setting 'vcpu-pin'"),
        ({**_LIVE, "setting": "memory-stats-period\n"}, "unknown setting"),
        ({**_LIVE, "setting": 5}, "no 'setting' string"),
        ({**_LIVE, "prior": -1}, "no or an out-of-range 'prior'"),
        ({**_LIVE, "new": 2**31}, "no or an out-of-range 'new'"),
        ({**_LIVE, "new": True}, "non-integer 'new'"),
        ({**_LIVE, "new": 10.0}, "non-integer 'new'"),
        ({**_LIVE, "prior": "0"}, "non-integer 'prior'"),
        ({k: v for k, v in _LIVE.items() if k != "domain_id"}, "no or an out-of-range 'domain_id'"),
        ({**_LIVE, "domain_id": -2}, "out-of-range 'domain_id'"),
        ({k: v for k, v in _LIVE.items() if k != "uuid"}, "no 'uuid' string"),
    ],
)
def test_malformed_entries_are_refused_with_one_line(doc: object, problem: str) -> None:
    with pytest.raises(ValueError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        entry_from_json(doc, 3)


def test_a_journal_in_the_pre_typed_shape_is_undone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The JSON exactly as journals were written before the entries were typed (kvmtune_journal 1)."""
    root = tmp_path / "host"
    conf = root / "etc/sysctl.d/90-kvmtune.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("vm.swappiness = 10\n")
    value = root / "proc/sys/vm/swappiness"
    value.parent.mkdir(parents=True)
    value.write_text("10\n")
    journals = tmp_path / "journal"
    journals.mkdir()
    jid = "20260101T000000Z-abcdef"
    doc = {
        "kvmtune_journal": 1, "id": jid, "created": "2026-01-01T00:00:00Z", "argv": ["kvmtune", "fix", "--host"],
        "root": str(root), "state": "applied", "error": None, "history": [],
        "changes": [
            {"kind": "runtime", "what": "write /proc/sys/vm/swappiness", "path": "/proc/sys/vm/swappiness",
             "real_path": str(value), "parse": "plain", "prior": "60", "new": "10",
             "restore": [[str(value), "60", "/proc/sys/vm/swappiness"]], "status": "done"},
            {"kind": "file", "what": "create /etc/sysctl.d/90-kvmtune.conf", "path": str(conf),
             "shown": "/etc/sysctl.d/90-kvmtune.conf", "prior_b64": None, "prior_mode": None, "prior_uid": None,
             "prior_gid": None, "after_sha256": hashlib.sha256(b"vm.swappiness = 10\n").hexdigest(),
             "temp": str(conf.with_name(".90-kvmtune.conf.kvmtune-x.tmp")), "created_dirs": [], "status": "done"},
        ],
    }
    (journals / f"{jid}.json").write_text(json.dumps(doc))
    assert main(["undo", jid, "--yes", "--journal-dir", str(journals), "--root", str(root)]) == 0, capsys.readouterr()
    assert not conf.exists()
    assert value.read_text() == "60\n"
    after = json.loads((journals / f"{jid}.json").read_text())
    assert after["state"] == "undone"
    assert [c["status"] for c in after["changes"]] == ["undone", "undone"]
    assert after["changes"][1]["prior_b64"] is None  # written back in the same shape
