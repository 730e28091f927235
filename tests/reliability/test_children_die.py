"""Children started through kvmtune's Runner die with kvmtune, even when it is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kvmtune.runner import ChildFromThread, Runner

PARENT = r"""
import subprocess, sys
from kvmtune.runner import Runner
r = Runner()
pidfile = sys.argv[2]
if sys.argv[1] == "popen":
    r.popen(["sh", "-c", f"echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile} && exec sleep 60"],
            stdin=subprocess.DEVNULL, start_new_session=True)
    print("ready", flush=True)
    import time; time.sleep(60)
else:
    print("ready", flush=True)
    r.run(["sh", "-c", f"echo $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile} && exec sleep 60"], timeout=120)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("how", ["popen", "run"])
def test_child_dies_when_kvmtune_is_sigkilled(tmp_path: Path, how: str) -> None:
    pidfile = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, how, str(pidfile)], stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None and parent.stdout.readline() == b"ready\n"
        deadline = time.monotonic() + 20
        while not pidfile.exists():
            assert time.monotonic() < deadline, "child never started"
            time.sleep(0.02)
        child = int(pidfile.read_text())
        assert _alive(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 2
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.02)
        survived = _alive(child)
        if survived:
            os.kill(child, signal.SIGKILL)
        assert not survived, f"{how}: child {child} outlived its SIGKILLed parent by 2 s"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_long_lived_child_from_a_thread_is_refused() -> None:
    """PR_SET_PDEATHSIG follows the forking thread: a daemon started from a worker would die with the worker."""
    errors: list[BaseException] = []

    def start() -> None:
        try:
            Runner().popen(["true"])
        except ChildFromThread as exc:
            errors.append(exc)

    t = threading.Thread(target=start)
    t.start()
    t.join()
    assert errors and "main thread" in str(errors[0])


def test_short_command_from_a_thread_is_allowed() -> None:
    results = []
    t = threading.Thread(target=lambda: results.append(Runner().run(["true"])))
    t.start()
    t.join()
    assert results and results[0].ok


def test_popen_keeps_its_own_preexec() -> None:
    with pytest.raises(TypeError):
        Runner().popen(["true"], preexec_fn=lambda: None)


def test_fio_jobs_die_with_kvmtune(tmp_path: Path) -> None:
    """fio forks a process per job by default (not covered by the parent-death signal): run as threads."""
    import shutil

    if shutil.which("fio") is None:
        pytest.skip("fio not installed")
    script = (
        "import sys\nfrom kvmtune.runner import Runner\nprint('ready', flush=True)\n"
        f"Runner().run(['fio', '--name=t', '--filename={tmp_path}/f', '--size=4m', '--rw=randread', "
        "'--runtime=30', '--time_based', '--numjobs=2'], timeout=120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None and parent.stdout.readline() == b"ready\n"
        deadline = time.monotonic() + 20
        fios: list[int] = []
        while len(fios) < 1 and time.monotonic() < deadline:
            # only the fio that this test's parent started: another fio on the machine (a benchmark, another
            # test) is not ours to judge or to kill
            fios = [int(p) for p in os.listdir("/proc")
                    if p.isdigit() and _ppid(int(p)) == parent.pid and _cmd(int(p)).startswith(b"fio\0--thread")]
            time.sleep(0.05)
        assert fios, "fio did not start (with --thread)"
        time.sleep(1.0)  # its jobs running
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 2
        while any(_alive(p) for p in fios) and time.monotonic() < deadline:
            time.sleep(0.02)
        left = [p for p in fios if _alive(p)]
        for p in left:
            os.kill(p, signal.SIGKILL)
        assert not left
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _cmd(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
