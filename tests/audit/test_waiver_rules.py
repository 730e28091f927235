"""Waiver matching and the baseline's keys (issue 33): by UUID across a rename, globs, expiry on its last
day, stale only where the waiver could have matched, and a malformed <metadata> waiver is one error line."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest

from kvmtune.audit.finding import Finding, FixHint, Severity, Target, Waiver
from kvmtune.audit.waivers import apply_baseline, apply_waivers, counted, guest_waivers, read_baseline
from kvmtune.errors import InputError
from kvmtune.model.guest import Guest

TODAY = date(2026, 6, 1)


def finding(rule: str, domain: str | None, device: str | None = None, host: str = "hv1") -> Finding:
    return Finding(rule, "slug", "disk-cache", Severity.HIGH, "certain", Target(host, domain, device), "a", "e", "ev",
                   "summary", "why", FixHint("manual", "", False))


def guest(name: str, uuid: str | None = None, waivers: tuple[dict[str, str], ...] = ()) -> Guest:
    return Guest(name=name, origin=f"/x/{name}.xml", origin_kind="xml", uuid=uuid, waivers=waivers)


def test_globs_uuid_target_and_the_last_day() -> None:
    fs = [finding("KVM-STO-004", "db01", "disk:vdb"), finding("KVM-STO-004", "db01", "disk:vda"),
          finding("KVM-STO-004", "web01", "disk:vdb"), finding("KVM-HST-019", None, "cpu")]
    ws = [Waiver("KVM-STO", "scratch", guest="0F6A*", target="disk:vdb", expires=TODAY, origin="k.toml:1"),
          Waiver("KVM-HST-019", "lab host", host="hv*", origin="k.toml:7")]
    notes = apply_waivers(fs, ws, [guest("db01", "0f6a1234-0000-0000-0000-000000000000"), guest("web01")],
                          today=TODAY, host="hv1", rule_ids=["KVM-STO-004", "KVM-HST-019"])
    # the guest glob matches db01 by its UUID; the target glob keeps vda out; a host finding has no guest
    assert [f.waiver is not None for f in fs] == [False, False, False, True]
    assert notes.waived == 1 and notes.stale == ["stale waiver KVM-STO guest=0F6A* target=disk:vdb (k.toml:1): matched "
                                                 "no finding in this run; remove it"]
    fs2 = [finding("KVM-STO-004", "db01", "disk:vdb")]
    apply_waivers(fs2, [Waiver("KVM-STO", "x", guest="0f6a*", target="disk:vdb", expires=TODAY)],
                  [guest("db01", "0f6a1234-0000-0000-0000-000000000000")], today=TODAY, host="hv1", rule_ids=["KVM-STO-004"])
    assert fs2[0].waiver is not None  # expires is the last day it waives
    assert counted(fs2) == []


def test_stale_only_where_it_could_have_matched() -> None:
    ws = [Waiver("KVM-STO-004", "x", host="other-host", origin="a"), Waiver("KVM-NET", "y", origin="b")]
    notes = apply_waivers([], ws, [], today=TODAY, host="hv1", rule_ids=["KVM-STO-004"])
    assert notes.stale == []  # another host's waiver, and a rule that did not run (--only), are not stale


def test_an_expired_waiver_says_so_and_stops_waiving() -> None:
    fs = [finding("KVM-STO-004", "db01")]
    notes = apply_waivers(fs, [Waiver("KVM-STO-004", "x", expires=date(2026, 5, 31), origin="k.toml:3")], [],
                          today=TODAY, host="hv1", rule_ids=["KVM-STO-004"])
    assert fs[0].waiver is None and counted(fs) == fs
    assert notes.expired == ["expired waiver KVM-STO-004 (k.toml:3): ended 2026-05-31; 1 finding(s) it matched count again"]


def test_a_malformed_metadata_waiver_is_one_error_line() -> None:
    errors: list[str] = []
    ws = guest_waivers([guest("db01", waivers=({"rule": "KVM-STO-004"},)),
                        guest("db02", waivers=({"rule": "KVM-STO-004", "reason": "r", "expires": "soon"},)),
                        guest("db03", waivers=({"rule": "KVM-STQ-004", "reason": "r"},)),
                        guest("db04", "AB-CD", waivers=({"rule": "kvm-sto-004", "reason": "ok", "target": "disk:vda"},))],
                       errors)
    assert len(errors) == 3
    assert errors[:2] == [
        "/x/db01.xml: <metadata> waiver 1 of guest db01: no reason attribute (every waiver says why)",
        "/x/db02.xml: <metadata> waiver 1 of guest db02: expires 'soon' is not a date (YYYY-MM-DD)",
    ]
    assert errors[2].startswith("/x/db03.xml: <metadata> waiver 1 of guest db03: unknown rule id 'KVM-STQ-004'")
    # bound to the guest it came from (its name and source), not to a pattern made of its UUID
    assert ws == [Waiver("KVM-STO-004", "ok", guest="db04", target="disk:vda", origin="<metadata> of db04",
                         guest_source="/x/db04.xml")]


def test_the_baseline_matches_by_uuid_across_a_rename_and_lists_the_resolved(tmp_path: Path) -> None:
    uuid = "0f6a1234-0000-0000-0000-000000000000"
    base = tmp_path / "base.json"
    base.write_text(json.dumps({"schema_version": 1, "findings": [
        {"rule": "KVM-STO-004", "summary": "s1", "target": {"host": "hv1", "domain": "db-old", "device": "disk:vda",
                                                             "uuid": uuid}},
        {"rule": "KVM-NET-001", "summary": "gone", "target": {"host": "hv1", "domain": "web01", "device": "net:x"}},
        {"rule": "KVM-HST-019", "summary": "s3", "target": {"host": "hv1", "domain": None, "device": "cpu"}},
    ]}))
    fs = [finding("KVM-STO-004", "db-new", "disk:vda"), finding("KVM-HST-019", None, "cpu"),
          finding("KVM-STO-004", "db-new", "disk:vdb"), finding("KVM-HST-019", None, "cpu", host="hv2")]
    resolved = apply_baseline(fs, read_baseline(str(base)), [guest("db-new", uuid.upper())])
    assert [f.new for f in fs] == [False, False, True, True]  # message text plays no part; host and device do
    assert [e["summary"] for e in resolved] == ["gone"]


@pytest.mark.parametrize("text", ['{"findings": []}', "[]", "not json", '{"schema_version": 1, "findings": [{"rule": 1}]}'])
def test_a_baseline_that_is_not_a_report_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "b.json"
    path.write_text(text)
    with pytest.raises(InputError, match=str(path)):
        read_baseline(str(path))
