"""Issue 43 item 4: a settings file is read from the descriptor whose owner was checked, below directories only
root and the invoking user can change; journals are written and undone through directory descriptors.

The race is real: a second process swaps the settings file with another user's copy
(``renameat2(RENAME_EXCHANGE)``) as fast as it can while the real loader reads it 500 times."""

from __future__ import annotations

import contextlib
import os
import platform
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
