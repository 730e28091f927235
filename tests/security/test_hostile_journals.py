"""Issue 29 items 1, 10 and 11: a journal is untrusted input to ``undo``, which runs as root.

A journal planted in a ``--root`` tree (capture trees are untrusted) or in a journal directory another user
can write must not make ``undo`` write, delete or restore anything outside its tree, write a value the
settings table does not set, or print a name it read from the file. Journals are read as bounded regular
files (a FIFO or a link to /dev/zero costs one line, not a hang); a relative ``--root`` leaves absolute
paths in the journal, and the ``Undo with:`` line ``fix --apply`` prints is a command that works.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvmtune.cli import main

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "hosts" / "rhel6-old"
JID = "20260101T000000Z-abcdef"
NOBODY = 65534


def kvmtune(*args: str, cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The real CLI in a child process (this worktree's sources), without a journal directory from the env."""
    env = {k: v for k, v in os.environ.items() if k != "KVMTUNE_JOURNAL_DIR"}
    env["PYTHONPATH"] = str(REPO / "src")
    return subprocess.run([sys.executable, "-m", "kvmtune", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=timeout, check=False)


def digest(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(d.rglob("*"))}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    t = tmp_path / "tree"
    shutil.copytree(FIXTURE, t, symlinks=True)
    return t


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """Files outside the tree standing in for /etc/cron.d, /etc/shadow, an empty /etc directory, a sysctl."""
    o = tmp_path / "outside"
    (o / "cron.d").mkdir(parents=True)
    (o / "shadow").write_text("root:$6$secret:19000::::::\n")
    (o / "emptydir").mkdir()
    (o / "core_pattern").write_text("core\n")
    return o


def file_entry(path: Path, *, temp: Path | None = None, created: list[Path] | None = None, prior: bytes | None,
               shown: str = "/etc/sysctl.d/90-kvmtune.conf") -> dict[str, object]:
    return {
        "kind": "file", "what": "create /etc/sysctl.d/90-kvmtune.conf", "status": "planned", "path": str(path),
        "shown": shown, "prior_b64": None if prior is None else base64.b64encode(prior).decode(),
        "prior_mode": 0o644, "prior_uid": None, "prior_gid": None, "after_sha256": None,
        "temp": str(temp or path.with_name(f".{path.name}.kvmtune-{JID}.tmp")),
        "created_dirs": [str(d) for d in created or []],
    }


def runtime_entry(real: Path, host_path: str, restore: list[tuple[Path, str]]) -> dict[str, object]:
    return {
        "kind": "runtime", "what": f"write {host_path}", "status": "planned", "path": host_path,
        "real_path": str(real), "parse": "plain", "prior": "60", "new": "10",
        "restore": [[str(t), v, host_path] for t, v in restore],
    }


def plant(directory: Path, root: Path | str, changes: list[dict[str, object]], jid: str = JID) -> Path:
    """A journal as a hostile capture tree (or another user) would leave it: state applied, well-formed."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    doc = {"kvmtune_journal": 1, "id": jid, "created": "2026-01-01T00:00:00Z", "argv": ["kvmtune", "fix"],
           "root": str(root), "state": "applied", "error": None, "history": [], "changes": changes}
    path = directory / f"{jid}.json"
    path.write_text(json.dumps(doc))
    path.chmod(0o600)
    return path


def tree_journals(tree: Path) -> Path:
    return tree / "var/lib/kvmtune/journal"


# --------------------------------------------------------------------------- item 1: paths inside the root


def test_a_planted_tree_journal_touches_nothing_outside_the_tree(tree: Path, outside: Path) -> None:
    """The reproduction of issue 29 item 1: a cron line, a deleted file, a removed directory, a sysctl."""
    inside = tree / "etc/sysctl.d/90-kvmtune.conf"  # a well-formed entry too: nothing is done before all are checked
    inside.parent.mkdir(parents=True, exist_ok=True)
    inside.write_text("vm.swappiness = 10\n")
    swappiness = tree / "proc/sys/vm/swappiness"
    plant(tree_journals(tree), tree.resolve(), [
        file_entry(inside, prior=None),
        file_entry(outside / "cron.d/evil", temp=outside / "shadow", created=[outside / "emptydir"],
                   prior=b"* * * * * root /tmp/evil\n"),
        runtime_entry(swappiness, "/proc/sys/vm/swappiness", [(outside / "core_pattern", "|/tmp/evil %p")]),
    ])
    before, tree_before = digest(outside), digest(tree)

    res = kvmtune("undo", "--root", str(tree), JID, "--yes")

    assert res.returncode != 0
    assert digest(outside) == before  # no cron file, shadow and the empty directory still there, value unchanged
    assert digest(tree) == tree_before  # refused whole: not even the well-formed entry was undone
    err = res.stderr
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"change 2 (file): file {outside / 'cron.d/evil'} is outside the tree {tree}" in err
    assert f"change 3 (runtime): restore target {outside / 'core_pattern'} is outside the tree" in err
    assert "restored" not in res.stdout


def test_temp_and_created_dirs_are_checked_on_their_own(tree: Path, outside: Path) -> None:
    target = tree / "etc/new.d/x.conf"
    plant(tree_journals(tree), tree.resolve(), [
        file_entry(target, temp=outside / "shadow", created=[outside / "emptydir"], prior=None),
    ])
    before = digest(outside)
    res = kvmtune("undo", "--root", str(tree), JID, "--yes")
    assert res.returncode != 0 and digest(outside) == before
    assert f"temp file {outside / 'shadow'} is outside the tree" in res.stderr
    assert f"created directory {outside / 'emptydir'} is outside the tree" in res.stderr


def test_a_restore_target_the_settings_table_does_not_set_is_refused(tree: Path) -> None:
    """Inside the tree, but kernel.core_pattern is no value kvmtune sets: '|/tmp/evil %p' is never written."""
    core = tree / "proc/sys/kernel/core_pattern"
    core.parent.mkdir(parents=True, exist_ok=True)
    core.write_text("core\n")
    plant(tree_journals(tree), tree.resolve(), [
        runtime_entry(tree / "proc/sys/vm/swappiness", "/proc/sys/vm/swappiness", [(core, "|/tmp/evil %p")]),
        runtime_entry(core, "/proc/sys/kernel/core_pattern", [(core, "|/tmp/evil %p")]),
    ])
    res = kvmtune("undo", "--root", str(tree), JID, "--yes")
    assert res.returncode != 0
    assert core.read_text() == "core\n"
    assert "change 1 (runtime): restore target /proc/sys/kernel/core_pattern is not a value kvmtune sets" in res.stderr
    assert "change 2 (runtime): /proc/sys/kernel/core_pattern is not a value kvmtune sets" in res.stderr


def test_a_link_in_the_tree_leading_out_of_it_is_refused(tree: Path, outside: Path) -> None:
    (tree / "etc/cron.d").symlink_to(outside / "cron.d")
    plant(tree_journals(tree), tree.resolve(), [file_entry(tree / "etc/cron.d/evil", prior=b"* * * * * root x\n")])
    before = digest(outside)
    res = kvmtune("undo", "--root", str(tree), JID, "--yes")
    assert res.returncode != 0 and digest(outside) == before
    assert f"change 1 (file): file {tree / 'etc/cron.d/evil'} leads out of the host root" in res.stderr


def test_a_journal_made_for_another_root_is_refused(tree: Path, outside: Path) -> None:
    """The tree's journal claims the outside directory (or /) as its root: every path would be 'inside'."""
    plant(tree_journals(tree), outside, [file_entry(outside / "cron.d/evil", prior=b"* * * * * root x\n")])
    plant(tree_journals(tree), "/", [file_entry(outside / "cron.d/evil", prior=b"x\n")], jid="20260101T000000Z-000002")
    before = digest(outside)
    for jid in (JID, "20260101T000000Z-000002"):
        res = kvmtune("undo", "--root", str(tree), jid, "--yes")
        assert res.returncode != 0 and digest(outside) == before
        assert "was made for" in res.stderr and f"not --root {tree}" in res.stderr


def test_a_tree_journal_may_not_redefine_libvirt_domains_or_touch_images_outside(tree: Path, outside: Path) -> None:
    image = outside / "disk.img"
    image.write_bytes(b"\0" * 512)
    plant(tree_journals(tree), tree.resolve(), [
        {"kind": "domain", "what": "domain x: redefine", "status": "done", "uri": "qemu:///system", "name": "x",
         "uuid": "u", "prior_xml": "<domain/>", "new_xml": "", "after_xml": None, "was_active": False},
        {"kind": "image", "what": "image", "status": "done", "path": str(tree / "img"), "format": "raw",
         "options": "", "backup": str(image), "temp": str(tree / ".img.kvmtune-x.tmp"), "prior_ino": 1,
         "prior_size": 1, "after_ino": 2, "purged": False},
        {"kind": "live", "what": "domain y: set live", "status": "done", "uri": "qemu:///system", "name": "y",
         "uuid": "u", "setting": "memory-stats-period", "prior": 0, "new": 10, "domain_id": 3},
    ])
    before = digest(outside)
    res = kvmtune("undo", "--root", str(tree), JID, "--yes")
    assert res.returncode != 0 and digest(outside) == before
    assert "change 1 (domain): a journal of the tree" in res.stderr and "may not redefine libvirt domain 'x'" in res.stderr
    assert f"change 2 (image): backup {image} is outside the tree" in res.stderr
    assert "change 3 (live): a journal of the tree" in res.stderr and "may not change libvirt domain 'y' live" in res.stderr
    res = kvmtune("undo", "--purge-backups", "--root", str(tree), JID)
    assert res.returncode != 0 and image.exists()


TEST_UUID = "6695eb01-f6a4-8304-79aa-97f2502e193f"  # the domain "test" of libvirt's test:///default driver


def domain_entry(uri: str, name: str, uuid: str, prior_xml: str) -> dict[str, object]:
    return {"kind": "domain", "what": f"domain {name}: redefine", "status": "done", "uri": uri, "name": name,
            "uuid": uuid, "prior_xml": prior_xml, "new_xml": "", "after_xml": None, "was_active": False}


def test_a_tree_journal_claiming_this_host_makes_status_and_staged_ask_no_one(tmp_path: Path, tree: Path) -> None:
    """``fix --status --root TREE`` and ``audit --staged --root TREE`` read the tree's journals. One that says it was
    made for ``/`` passed as this host's there (``undo --root`` alone compared the roots), so its domain entry's
    URI was opened: here a libvirt socket of the tree's choosing (a listener that counts connections), as it could
    have been ``qemu+ssh://`` or ``qemu+tcp://`` another host. Now it is refused, as ``undo --root TREE`` refuses it."""
    import socket
    import threading

    pytest.importorskip("libvirt")
    sock_path = tmp_path / "l.sock"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(sock_path))
    srv.listen(8)
    srv.settimeout(0.1)
    connected: list[int] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            connected.append(1)
            conn.close()

    xml = f"<domain type='kvm'><name>x</name><uuid>{TEST_UUID}</uuid></domain>"
    plant(tree_journals(tree), "/", [domain_entry(f"qemu+unix:///system?socket={sock_path}", "x", TEST_UUID, xml)])
    server = threading.Thread(target=serve)
    server.start()
    try:
        status = kvmtune("fix", "--status", "--root", str(tree), "--no-config", "--format", "json")
        audit = kvmtune("audit", "--host", "--root", str(tree), "--staged", "--format", "json", "--no-config")
    finally:
        stop.set()
        server.join()
        srv.close()
    assert connected == []
    assert status.returncode == 0, status.stderr
    (refused,) = json.loads(status.stdout)["refused"]
    assert refused["journal"] == JID and "was made for this host (/), not --root" in refused["problem"]
    assert json.loads(status.stdout)["staged"] == []
    staged = json.loads(audit.stdout)["staged"]
    assert (staged["journals"], staged["refused_journals"], staged["changes"]) == (0, 1, 0)


@pytest.mark.parametrize(("uuid", "prior_xml", "problem"), [
    ("u", "<domain><name>test</name><uuid>u</uuid></domain>", "change 1 (domain): 'u' is not a domain UUID"),
    (TEST_UUID, "<domain><name>other</name><uuid>0f0e0d0c-0b0a-0908-0706-050403020100</uuid></domain>",
     "change 1 (domain): its prior definition is of domain 'other' ('0f0e0d0c-0b0a-0908-0706-050403020100'), not "
     f"of the domain it names ('test', {TEST_UUID})"),
    (TEST_UUID, "<domain><name>test</name></domain>", "its prior definition is of domain 'test' (''), not of"),
    (TEST_UUID, "<domain><name>test</name><uuid>" + TEST_UUID + "</uuid>", "change 1 (domain): its prior definition"),
])
def test_a_domain_entry_whose_prior_definition_is_of_another_domain_is_refused(
    tmp_path: Path, uuid: str, prior_xml: str, problem: str
) -> None:
    """``defineXML`` redefines the domain its XML names: an entry naming domain ``test`` (by name and UUID) whose
    prior definition is of ``other`` made undo define ``other`` (a new domain, or another one's definition) and only
    then notice that ``test`` had not changed. Refused before anything is done, naming the journal."""
    pytest.importorskip("libvirt")
    journals = tmp_path / "journals"
    path = plant(journals, "/", [domain_entry("test:///default", "test", uuid, prior_xml)])
    res = kvmtune("undo", "--journal-dir", str(journals), JID, "--yes")
    assert res.returncode != 0
    assert f"{path}: refused, nothing restored: " in res.stderr and problem in res.stderr, res.stderr
    assert len(res.stderr.splitlines()) == 1


def test_what_undo_prints_comes_from_the_path_not_the_journal(tree: Path) -> None:
    """A well-formed entry inside the tree that claims to be the sysctl drop-in: undo names the file it wrote."""
    real = tree / "etc/motd"
    real.write_text("changed\n")
    plant(tree_journals(tree), tree.resolve(), [file_entry(real, prior=b"welcome\n")])
    res = kvmtune("undo", "--root", str(tree), JID, "--yes")
    assert res.returncode == 0, res.stderr
    assert real.read_text() == "welcome\n"
    assert f"{real}: restored" in res.stdout
    assert "90-kvmtune.conf" not in res.stdout


def test_relative_paths_in_a_journal_are_refused(tmp_path: Path, tree: Path) -> None:
    journals = tmp_path / "journals"
    plant(journals, tree.resolve(), [file_entry(Path("etc/motd"), prior=b"x\n")])
    res = kvmtune("undo", "--root", str(tree), "--journal-dir", str(journals), JID, "--yes", cwd=tmp_path)
    assert res.returncode != 0 and not (tmp_path / "etc").exists()
    assert "change 1 (file): file 'etc/motd' is not a normal absolute path" in res.stderr


# --------------------------------------------------------------------------- item 1: who may write journals


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_journal_owned_by_another_user_is_refused(tmp_path: Path, tree: Path) -> None:
    journals = tmp_path / "journals"
    motd = tree / "etc/motd"
    motd.write_text("changed\n")
    path = plant(journals, tree.resolve(), [file_entry(motd, prior=b"welcome\n")])
    os.chown(path, NOBODY, NOBODY)
    res = kvmtune("undo", "--root", str(tree), "--journal-dir", str(journals), JID, "--yes")
    assert res.returncode != 0 and motd.read_text() == "changed\n"
    assert f"a journal owned by uid {NOBODY}, not by the invoking user" in res.stderr
    assert len(res.stderr.splitlines()) == 1
    listed = kvmtune("undo", "--list", "--journal-dir", str(journals))
    assert listed.returncode == 0 and f"{JID}  refused" in listed.stdout and f"uid {NOBODY}" in listed.stdout


def test_a_journal_or_directory_others_can_write_is_refused(tmp_path: Path, tree: Path) -> None:
    journals = tmp_path / "journals"
    motd = tree / "etc/motd"
    motd.write_text("changed\n")
    path = plant(journals, tree.resolve(), [file_entry(motd, prior=b"welcome\n")])
    path.chmod(0o620)
    res = kvmtune("undo", "--root", str(tree), "--journal-dir", str(journals), JID, "--yes")
    assert res.returncode != 0 and "a journal writable by group or others (mode 0620)" in res.stderr
    path.chmod(0o600)
    journals.chmod(0o777)
    for args in (["undo", "--root", str(tree), JID, "--yes"], ["undo", "--list"]):
        res = kvmtune(*args[:1], "--journal-dir", str(journals), *args[1:])
        assert res.returncode != 0, args
        assert f"{journals}: a journal directory writable by group or others (mode 0777); refused" in res.stderr
        assert len(res.stderr.splitlines()) == 1
    assert motd.read_text() == "changed\n"
    # fix --apply refuses to write its journal there too: nothing in the tree changes
    before = digest(tree)
    res = kvmtune("fix", "--host", "--root", str(tree), "--journal-dir", str(journals), "--apply", "--yes")
    assert res.returncode != 0 and "writable by group or others" in res.stderr
    assert digest(tree) == before


# --------------------------------------------------------------------------- item 10: bounded reads


def test_a_fifo_or_a_link_to_dev_zero_in_the_journal_directory_costs_one_line(tmp_path: Path) -> None:
    journals = tmp_path / "journals"
    journals.mkdir(mode=0o700)
    fifo, zero, big = (journals / f"20260101T000000Z-00000{n}.json" for n in (1, 2, 3))
    os.mkfifo(fifo, 0o600)
    zero.symlink_to("/dev/zero")
    with open(big, "wb") as fh:  # sparse: larger than any journal kvmtune writes
        fh.truncate(65 * 1024 * 1024)
    big.chmod(0o600)
    started = time.monotonic()
    res = kvmtune("undo", "--list", "--journal-dir", str(journals), timeout=30)
    assert time.monotonic() - started < 30
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith(fifo.stem) and "not a regular file (a FIFO)" in lines[0]
    assert lines[1].startswith(zero.stem) and "a symbolic link; not followed" in lines[1]
    assert lines[2].startswith(big.stem) and "larger than 64 MiB" in lines[2]
    res = kvmtune("undo", "--journal-dir", str(journals), fifo.stem, "--yes", timeout=30)
    assert res.returncode != 0 and "not a regular file (a FIFO)" in res.stderr
    assert len(res.stderr.splitlines()) == 1


# --------------------------------------------------------------------------- item 11 and the undo hint


def test_fix_with_a_relative_root_is_undone_from_another_directory(tmp_path: Path, tree: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    before = digest(tree)
    res = kvmtune("fix", "--host", "--root", "tree", "--apply", "--yes", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    (journal,) = tree_journals(tree).glob("*.json")
    doc = json.loads(journal.read_text())
    paths = [c.get("path") if c["kind"] == "file" else c["real_path"] for c in doc["changes"]]
    assert paths and all(str(p).startswith(str(tree) + "/") for p in paths), paths
    dropins = [tree / p for p in ("etc/sysctl.d/90-kvmtune.conf", "etc/modprobe.d/kvmtune.conf")]
    assert any(p.exists() for p in dropins)
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("Undo with: "))
    undo = shlex.split(line.removeprefix("Undo with: "))
    assert undo[:2] == ["kvmtune", "undo"]
    res = kvmtune(*undo[1:], "--yes", cwd=elsewhere)
    assert res.returncode == 0, res.stderr
    assert not any(p.exists() for p in dropins)
    after = digest(tree)
    after = {k: v for k, v in after.items() if not k.startswith("var")}  # the journal itself stays
    assert after == before


def test_the_undo_hint_names_root_and_journal_dir_and_works(tmp_path: Path, tree: Path) -> None:
    spaced = tmp_path / "a tree; with $pace"
    tree.rename(spaced)
    journals = tmp_path / "my journals"
    res = kvmtune("fix", "--host", "--root", str(spaced), "--journal-dir", str(journals), "--apply", "--yes")
    assert res.returncode == 0, res.stderr
    (journal,) = journals.glob("*.json")
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("Undo with: "))
    assert line == "Undo with: " + shlex.join(
        ["kvmtune", "undo", "--root", str(spaced), "--journal-dir", str(journals), journal.stem])
    res = kvmtune(*shlex.split(line.removeprefix("Undo with: "))[1:], "--yes")  # as a shell would split it
    assert res.returncode == 0, res.stderr
    assert "Undone: journal" in res.stdout


def test_a_tree_run_that_would_journal_a_file_outside_the_tree_is_refused_before_any_change(
    tmp_path: Path, tree: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """fix --host --root TREE plus a domain file outside it: a tree's journal may name only paths in the tree."""
    xml = tmp_path / "vm.xml"
    xml.write_bytes((REPO / "examples" / "web01-legacy.xml").read_bytes())
    monkeypatch.delenv("KVMTUNE_JOURNAL_DIR")
    before, xml_before = digest(tree), xml.read_bytes()
    assert main(["fix", "--host", str(xml), "--root", str(tree), "--allow-bus-change", "--apply", "--yes"]) == 2
    err = capsys.readouterr().err
    assert f"is outside the tree {tree}" in err and "nothing changed" in err
    after = {k: v for k, v in digest(tree).items() if not k.startswith("var")}  # the journal directory's lock only
    assert after == before and xml.read_bytes() == xml_before
    assert list(tree_journals(tree).glob("*.json")) == []


def test_every_undo_hint_comes_from_the_journal_itself(tmp_path: Path) -> None:
    """fix's "Undo with:" and verify's "kept …; 'kvmtune undo …' restores" print the same command."""
    from kvmtune.fix.journal import Journal, default_dir

    tree = tmp_path / "a tree; $x"
    j = Journal.create(default_dir(str(tree)), ["kvmtune"], str(tree))
    assert j.undo_command() == f"kvmtune undo --root '{tree}' {j.id}"
    other = Journal.create(tmp_path / "jd", ["kvmtune"], "/")
    assert other.undo_command() == f"kvmtune undo --journal-dir {tmp_path / 'jd'} {other.id}"
    hostside = (Path(__file__).parents[2] / "src/kvmtune/verify/host/experiment.py").read_text()
    assert "journal.undo_command()" in hostside and "'kvmtune undo {journal.id}'" not in hostside
