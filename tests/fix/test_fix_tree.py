"""`fix --host --root TREE`: the output names the tree, the journal stays in it, undo gives back bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvmtune.cli import main


def test_tree_fix_names_the_root_and_keeps_its_journal_in_the_tree(
    seed_host: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KVMTUNE_JOURNAL_DIR")
    assert main(["fix", "--host", "--root", str(seed_host)]) == 0
    assert f"host root: {seed_host} (a tree, not this host" in capsys.readouterr().out

    assert main(["fix", "--host", "--root", str(seed_host), "--apply", "--yes"]) == 0
    out = capsys.readouterr().out
    journals = list((seed_host / "var/lib/kvmtune/journal").glob("*.json"))
    assert len(journals) == 1
    jid = journals[0].stem
    assert f"Journal {jid} ({journals[0]})" in out

    assert main(["undo", "--list", "--root", str(seed_host)]) == 0
    listed = capsys.readouterr().out
    assert jid in listed and f"(in the tree {seed_host}, not this host)" in listed
    empty = tmp_path / "host-journals"
    assert main(["undo", "--list", "--journal-dir", str(empty)]) == 0
    assert jid not in capsys.readouterr().out


def test_undo_in_a_tree_restores_the_prior_bytes(
    seed_host: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KVMTUNE_JOURNAL_DIR")
    sched = seed_host / "sys/block/sda/queue/scheduler"
    before = sched.read_bytes()
    assert before == b"[none] mq-deadline kyber bfq\n"
    assert main(["fix", "--host", "--root", str(seed_host), "--apply", "--yes"]) == 0
    assert sched.read_bytes() != before
    jid = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("Undo with:")).rsplit(" ", 1)[1]
    assert main(["undo", jid, "--root", str(seed_host)]) == 0
    assert sched.read_bytes() == before  # not "none\n": a tree's file is a file, not sysfs
    assert (seed_host / "sys/block/sdb/queue/scheduler").read_bytes() == b"mq-deadline kyber [bfq] none\n"
