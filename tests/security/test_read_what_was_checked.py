"""Issue 43 item 4: a settings file is read from the descriptor whose owner was checked, below directories only
root and the invoking user can change; journals are written and undone through directory descriptors.

The races are real: a second process swaps the settings file with another user's copy (or the journal
directory with a link) by ``renameat2(RENAME_EXCHANGE)`` as fast as it can, while the real loader reads
the file 500 times (or the journal is saved 300 times)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import platform
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvmtune.audit.settings import load
from kvmtune.errors import InputError

NOBODY = 65534
TRIES = 500
RENAMEAT2 = {"x86_64": 316, "aarch64": 276}.get(platform.machine())
REPO = Path(__file__).resolve().parents[2]

# the racer: exchange the two names until killed (AT_FDCWD = -100, RENAME_EXCHANGE = 2). It dies with the
# test (PR_SET_PDEATHSIG) and after a minute in any case: it may run SCHED_FIFO on a CPU of its own.
RACER = textwrap.dedent("""
    import ctypes, os, signal, sys, time
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)
    a, b, nr = os.fsencode(sys.argv[1]), os.fsencode(sys.argv[2]), int(sys.argv[3])
    end = time.monotonic() + 60
    print("ready", flush=True)
    while time.monotonic() < end:
        for _ in range(1000):
            if libc.syscall(nr, -100, a, -100, b, 2) != 0:
                sys.exit(f"renameat2: {os.strerror(ctypes.get_errno())}")
""")


@contextlib.contextmanager
def racing(a: Path, b: Path) -> Iterator[subprocess.Popen[str]]:
    """The racer, running beside this process: on a CPU of its own and, where allowed, SCHED_FIFO, so that its
    exchanges land between this process's system calls (on a loaded host, two ordinary processes sharing
    CPUs mostly take turns, and the race is seldom run at all)."""
    cpus = sorted(os.sched_getaffinity(0))
    racer = subprocess.Popen([sys.executable, "-c", RACER, str(a), str(b), str(RENAMEAT2)], stdout=subprocess.PIPE,
                             text=True)
    try:
        if len(cpus) > 1:
            os.sched_setaffinity(racer.pid, {cpus[-1]})
            os.sched_setaffinity(0, set(cpus[:-1]))
            with contextlib.suppress(OSError):
                os.sched_setscheduler(racer.pid, os.SCHED_FIFO, os.sched_param(1))
        assert racer.stdout is not None and racer.stdout.readline() == "ready\n"
        yield racer
    finally:
        racer.kill()
        racer.wait()
        os.sched_setaffinity(0, set(cpus))


OWN = 'fail_on = "high"\n'
FOREIGN = '[[waiver]]\nrule = "KVM-STO-004"\nreason = "planted by uid 65534"\n'


def _settings_pair(tmp_path: Path) -> tuple[Path, Path]:
    conf = tmp_path / "conf"  # root's own directory, 0755: only the files race, not the directory check
    conf.mkdir(mode=0o755)
    own, foreign = conf / "kvmtune.toml", conf / "planted.toml"
    own.write_text(OWN)
    foreign.write_text(FOREIGN)
    for p in (own, foreign):
        p.chmod(0o644)
    os.chown(foreign, NOBODY, NOBODY)
    return own, foreign


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
@pytest.mark.skipif(RENAMEAT2 is None, reason="renameat2's number is known here for x86_64 and aarch64 only")
def test_a_settings_file_swapped_by_renameat2_is_never_accepted(tmp_path: Path) -> None:
    own, foreign = _settings_pair(tmp_path)
    accepted = loaded = refused_foreign = 0
    other: set[str] = set()
    with racing(own, foreign) as racer:
        for _ in range(TRIES):
            try:
                settings = load([(str(own), True)])
            except InputError as exc:
                if str(exc).startswith(f"{own}: settings file owned by uid {NOBODY}"):
                    refused_foreign += 1  # the other user's file, seen on the descriptor that would be read
                else:
                    other.add(str(exc))
                continue
            loaded += 1
            accepted += any(w.reason == "planted by uid 65534" for w in settings.waivers)
        assert racer.poll() is None, "the racer stopped"
    assert accepted == 0, f"the other user's waiver was accepted in {accepted} of {TRIES} loads"
    assert not other  # one open, one fstat: nothing is "replaced while being read"
    # the race was live: both files were seen at that name, each several times
    assert loaded > 0 and refused_foreign > 0, (loaded, refused_foreign)


def test_a_libvirt_log_swapped_with_a_symbolic_link_is_never_followed(tmp_path: Path) -> None:
    """``capture`` follows a libvirt guest's log (root's, 0600) by its path; a link exchanged for it at any moment
    (between a look with ``islink`` and the open, as the follower once did: 230 of 500 opens followed the link)
    must not be followed to another file."""
    from kvmtune.capture.libvirt import LogFollower
    from kvmtune.host.root import HostReadError, HostRoot

    if RENAMEAT2 is None:
        pytest.skip("renameat2's number is known here for x86_64 and aarch64 only")
    logs = tmp_path / "qemu"
    logs.mkdir(mode=0o700)
    log, link = logs / "g.log", logs / "g.link"
    log.write_bytes(b"")
    log.chmod(0o600)
    secret = tmp_path / "secret"
    secret.write_bytes(b"not the guest's log\n")
    secret.chmod(0o600)
    link.symlink_to(secret)
    secret_ino = secret.stat().st_ino
    followed = opened = refused = 0
    with racing(log, link) as racer:
        for _ in range(TRIES):
            try:
                f = LogFollower(HostRoot(), str(log))
            except HostReadError as exc:
                assert "symbolic link; not followed" in str(exc), exc
                refused += 1
                continue
            opened += 1
            followed += os.fstat(f.fh.fileno()).st_ino == secret_ino
            f.close()
        assert racer.poll() is None, "the racer stopped"
    assert followed == 0, f"the link was followed in {followed} of {TRIES} opens"
    assert opened > 0 and refused > 0, (opened, refused)  # the race was live: both were seen at that name


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop("KVMTUNE_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "kvmtune", *argv], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_settings_file_below_a_directory_another_user_can_write_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    (theirs / "etc").mkdir(parents=True)
    path = theirs / "etc" / "kvmtune.toml"
    path.write_text(OWN)
    path.chmod(0o644)
    os.chown(theirs, NOBODY, NOBODY)  # nobody may rename etc/ away and put another one in its place
    done = _cli("config", "show", "--config", str(path))
    assert done.returncode == 2
    assert done.stderr == (f"kvmtune: {path}: directory {theirs} owned by uid {NOBODY}, neither root nor the "
                           "invoking user (uid 0); refused\n")
    os.chown(theirs, 0, 0)
    theirs.chmod(0o777)  # writable by all, not sticky
    done = _cli("config", "show", "--config", str(path))
    assert done.returncode == 2
    assert done.stderr == (f"kvmtune: {path}: directory {theirs} writable by group or others (mode 0777); "
                           "refused\n")
    theirs.chmod(0o1777)  # sticky, like /tmp: etc/ is root's, so no one else may rename it
    done = _cli("config", "show", "--config", str(path))
    assert done.returncode == 0, done.stderr
    os.chown(theirs / "etc", NOBODY, NOBODY)  # ... unless it is another user's own entry there
    done = _cli("config", "show", "--config", str(path))
    assert done.returncode == 2
    assert done.stderr == (f"kvmtune: {path}: directory {theirs} writable by group or others (mode 1777, its entry "
                           f"owned by uid {NOBODY}); refused\n")


def test_a_settings_file_reached_through_a_symbolic_link_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "kvmtune.toml").write_text(OWN)
    (tmp_path / "link").symlink_to(real)
    path = tmp_path / "link" / "kvmtune.toml"
    with pytest.raises(InputError) as exc:
        load([(str(path), True)])
    assert str(exc.value) == f"{path}: {tmp_path / 'link'} is a symbolic link; not followed"
    (real / "alias.toml").symlink_to(real / "kvmtune.toml")
    with pytest.raises(InputError, match=r"alias\.toml: a symbolic link; not followed$"):
        load([(str(real / "alias.toml"), True)])
    os.mkfifo(real / "fifo.toml")  # opened without waiting for a writer, then refused
    with pytest.raises(InputError, match=r"fifo.toml: not a regular file \(a FIFO\); not read$"):
        load([(str(real / "fifo.toml"), True)])


def test_a_relative_settings_path_is_walked_from_the_working_directory(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "k.toml").write_text(OWN)
    monkeypatch.chdir(tmp_path / "d")
    assert load([("../d/./k.toml", True)]).get("fail_on") == "high"


# --------------------------------------------------------------------------- journals: directory descriptors

FIXTURE = REPO / "tests" / "fixtures" / "hosts" / "rhel6-old"


def _cli_nojournal_env(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KVMTUNE_JOURNAL_DIR", "KVMTUNE_CONFIG")}
    env["PYTHONPATH"] = str(REPO / "src")
    return subprocess.run([sys.executable, "-m", "kvmtune", *argv], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


def _digest(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): p.read_text(errors="replace") if p.is_file() and not p.is_symlink() else "-"
            for p in sorted(d.rglob("*"))}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    t = tmp_path / "tree"
    shutil.copytree(FIXTURE, t, symlinks=True)
    return t


def _journal_in(journals: Path, tree: Path) -> str:
    """``fix --host --apply`` on the tree with its journal in ``journals``; the journal's id."""
    done = _cli_nojournal_env("fix", "--host", "--root", str(tree), "--journal-dir", str(journals), "--apply", "--yes")
    assert done.returncode == 0, done.stderr
    (name,) = [p.name for p in journals.iterdir() if p.suffix == ".json"]
    return name.removesuffix(".json")


def test_a_journal_directory_reached_through_a_symbolic_link_is_refused(tmp_path: Path, tree: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    jid = _journal_in(real / "journal", tree)
    (tmp_path / "via").symlink_to(real)
    journals = tmp_path / "via" / "journal"
    line = f"kvmtune: {journals}: {tmp_path / 'via'} is a symbolic link; not followed\n"
    fresh = tmp_path / "fresh"  # a tree fix --apply would change
    shutil.copytree(FIXTURE, fresh, symlinks=True)
    before = _digest(tree), _digest(fresh)
    for argv in (["undo", "--list"], ["undo", jid, "--yes", "--root", str(tree)],
                 ["fix", "--host", "--root", str(fresh), "--apply", "--yes"]):
        done = _cli_nojournal_env(argv[0], "--journal-dir", str(journals), *argv[1:])
        assert done.returncode == 2, (argv, done.stderr)
        assert done.stderr.endswith(line), (argv, done.stderr)
        assert len(done.stderr.splitlines()) == 1, done.stderr
    assert (_digest(tree), _digest(fresh)) == before  # nothing undone, nothing fixed
    assert [p.suffix for p in (real / "journal").iterdir()].count(".json") == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_journal_directory_below_a_directory_another_user_can_write_is_refused(tmp_path: Path, tree: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    jid = _journal_in(shared / "journal", tree)
    os.chown(shared, NOBODY, NOBODY)  # nobody could rename journal/ away and plant another
    journals = shared / "journal"
    for argv in (["undo", "--list"], ["undo", jid, "--yes", "--root", str(tree)]):
        done = _cli_nojournal_env(argv[0], "--journal-dir", str(journals), *argv[1:])
        assert done.returncode == 2, (argv, done.stderr)
        assert done.stderr == (f"kvmtune: {journals}: directory {shared} owned by uid {NOBODY}, neither root nor "
                               "the invoking user (uid 0); refused\n")
    os.chown(shared, 0, 0)
    shared.chmod(0o1777)  # sticky and world-writable, as /tmp: journal/ is root's own, so it is used
    done = _cli_nojournal_env("undo", "--list", "--journal-dir", str(journals))
    assert done.returncode == 0 and f"{jid}  applied" in done.stdout, done.stderr


@pytest.fixture(params=["openat2", "walk"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each journal test below runs with openat2 and with the O_NOFOLLOW walk a kernel without it gets."""
    from kvmtune import inputs

    monkeypatch.setattr(inputs._Openat2, "usable", request.param == "openat2")
    return str(request.param)


def test_open_beneath_refuses_links_and_paths_leading_out(tmp_path: Path, resolver: str) -> None:
    from kvmtune.inputs import open_beneath

    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "e" / "f").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "d")
    (tmp_path / "d" / "flink").symlink_to(tmp_path / "d" / "e" / "f")
    top = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    try:
        fd = open_beneath(top, "d/e/f", os.O_RDONLY)
        assert os.read(fd, 10) == b"x"
        os.close(fd)
        for rel in ("link/e/f", "d/flink", "d/../d/e/f", str(tmp_path / "d/e/f"), "../" + tmp_path.name):
            with pytest.raises(OSError) as exc:
                os.close(open_beneath(top, rel, os.O_RDONLY))
            assert exc.value.errno in (errno.ELOOP, errno.EXDEV, errno.ENOTDIR), (rel, exc.value)
    finally:
        os.close(top)


def test_undo_goes_through_directory_descriptors(tmp_path: Path, tree: Path, resolver: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """fix --apply and undo in this process (so the resolver chosen holds): the tree comes back, and every
    journal write was a name in the directory's descriptor (openat2 saw the names, or the walk did)."""
    from kvmtune import inputs
    from kvmtune.cli import main

    seen: list[str] = []
    real_open = inputs._Openat2.open

    def spy(dir_fd: int, rel: str, flags: int, mode: int) -> int | None:
        seen.append(rel)
        return real_open(dir_fd, rel, flags, mode)

    monkeypatch.setattr(inputs._Openat2, "open", staticmethod(spy))
    monkeypatch.delenv("KVMTUNE_JOURNAL_DIR", raising=False)
    journals = tmp_path / "journals"
    before = _digest(tree)
    assert main(["fix", "--host", "--root", str(tree), "--journal-dir", str(journals), "--apply", "--yes"]) == 0
    assert _digest(tree) != before
    (jid,) = [p.stem for p in journals.iterdir() if p.suffix == ".json"]
    assert main(["undo", "--root", str(tree), "--journal-dir", str(journals), jid, "--yes"]) == 0
    assert _digest(tree) == before
    assert json.loads((journals / f"{jid}.json").read_text())["state"] == "undone"
    assert f".{jid}.json.kvmtune-journal.tmp" in seen and ".lock" in seen  # every journal write went through it
    assert inputs._Openat2.usable == (resolver == "openat2")


def test_journal_writes_never_follow_a_directory_swapped_for_a_link(tmp_path: Path, tree: Path,
                                                                    resolver: str) -> None:
    """A racer exchanges the journal directory with a link to a directory of its choosing while undo saves
    the journal 300 times: nothing is ever written there (each save is refused or lands in the real one)."""
    from kvmtune.fix.journal import load

    journals = tmp_path / "journals"
    jid = _journal_in(journals, tree)
    journal = load(jid, journals)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "decoy").symlink_to(elsewhere)
    saved = refused = 0
    with racing(journals, tmp_path / "decoy") as racer:
        for _ in range(300):
            try:
                journal.save()
            except OSError:
                refused += 1
            else:
                saved += 1
        assert racer.poll() is None, "the racer stopped"
    assert list(elsewhere.iterdir()) == []
    assert saved > 0 and refused > 0, (saved, refused)  # the race was live


def test_a_file_fix_snapshots_is_never_read_through_a_link_swapped_in(tmp_path: Path) -> None:
    """fix's snapshot of a file it will replace (``read_state``: what undo puts back) with a racer exchanging
    the file and a link to a secret: the secret is never read, whatever the timing (refused, or the file)."""
    from kvmtune.fix.files import read_state

    conf = tmp_path / "etc" / "sysctl.d" / "90-kvmtune.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("vm.swappiness = 10\n")
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$secret:19000::::::\n")
    (tmp_path / "trap").symlink_to(secret)
    read = refused = 0
    with racing(conf, tmp_path / "trap") as racer:
        for _ in range(TRIES):
            try:
                state = read_state(conf)
            except OSError:
                refused += 1
                continue
            assert state.data in (None, b"vm.swappiness = 10\n"), state.data
            read += 1
        assert racer.poll() is None, "the racer stopped"
    assert read > 0 and refused > 0, (read, refused)
