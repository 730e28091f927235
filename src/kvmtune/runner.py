"""The one place where kvmtune runs external commands.

Every call is recorded (argv, exit code, duration, the tail of stderr) so
reports and bug reports can say exactly what was run.

Children die with kvmtune. Every child (short commands such as ``qemu-img
convert`` as well as QEMU, qemu-storage-daemon, OVS daemons and netload) is
started with the parent-death signal set to SIGKILL (``prctl(PR_SET_PDEATHSIG)``
in the child between fork and exec), so the kernel kills it when kvmtune dies,
even by SIGKILL. This was chosen over a pidfd or cgroup supervisor because it
needs no second process that could itself be killed, no cgroup delegation and
works for unprivileged users; its limits are handled here: the signal is tied to
the *thread* that forked, so long-lived children are only started from the main thread
(:func:`_check_thread`), and a parent that died between fork and ``prctl`` is
caught by comparing ``getppid()`` with the pid recorded before the fork. The
setting survives ``execve`` of ordinary programs (``ip netns exec``, QEMU); a
child must not daemonise (double-fork), and none of kvmtune's do. It is not
inherited by a child's own ``fork``: fio forks one process per job by default,
and those outlived a killed kvmtune until their runtime ended, so fio is always
run with ``--thread`` (its jobs are then threads of the one process the kernel
kills; fio measures the same either way).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import selectors
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

STDERR_TAIL = 2000
PR_SET_PDEATHSIG = 1


@functools.cache
def _prctl() -> Callable[[int, int, int, int, int], int]:
    """libc's ``prctl``, loaded in the parent the first time a child is started, not at import. It is looked up
    in the symbols this process already has (``dlopen(NULL)``: the C library Python runs on), not through
    ``ctypes.util.find_library``, which forks ``ldconfig -p``: a command no runner started."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


def _die_with_parent(parent_pid: int, prctl: Callable[[int, int, int, int, int], int]) -> None:
    """Runs in the child before exec: SIGKILL it when its parent dies, and at once if that already happened."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(127)


def _with_threads(argv: Sequence[str]) -> list[str]:
    """fio's jobs as threads (see the module docstring); other commands unchanged."""
    out = list(argv)
    if out and os.path.basename(out[0]) == "fio" and "--thread" not in out:
        out.insert(1, "--thread")
    return out


def die_with_parent_preexec(*, long_lived: bool = True) -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess`` that ties the child's life to this process.

    A short command waited for by the thread that started it cannot outlive that thread, so only
    ``long_lived`` children must come from the main thread."""
    if long_lived:
        _check_thread()
    parent, prctl = os.getpid(), _prctl()  # resolved here, in the parent: the child only calls it
    return lambda: _die_with_parent(parent, prctl)


class ChildFromThread(RuntimeError):
    """A child was started from a thread other than the main one (it would die when that thread ends)."""


def _check_thread() -> None:
    if threading.current_thread() is not threading.main_thread():
        raise ChildFromThread(
            "kvmtune starts child processes only from the main thread: PR_SET_PDEATHSIG would kill the child "
            "when the starting thread exits"
        )


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    too_large: bool = False  # stdout passed ``max_output``: the command was killed, stdout holds the first bytes

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.too_large

    @property
    def stderr_tail(self) -> str:
        return self.stderr[-STDERR_TAIL:]

    def describe_failure(self) -> str:
        """One line: what ran and why it failed."""
        cmd = " ".join(self.argv[:3]) + (" …" if len(self.argv) > 3 else "")
        if self.too_large:
            return f"'{cmd}' printed more than kvmtune reads of it; stopped"
        if self.timed_out:
            return f"'{cmd}' timed out after {self.duration_s:.1f}s"
        last = self.stderr.strip().splitlines()[-1] if self.stderr.strip() else "no error output"
        return f"'{cmd}' exited {self.returncode}: {last}"


@dataclass
class Runner:
    """Runs commands and keeps a log of what ran.

    ``history`` holds every :class:`CommandResult`; tests inspect it and the
    JSON report can include it.
    """

    history: list[CommandResult] = field(default_factory=list)
    default_timeout: float = 120.0

    def which(self, program: str) -> str | None:
        return shutil.which(program)

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        input_text: str | None = None,
        cwd: str | None = None,
        max_output: int | None = None,
    ) -> CommandResult:
        """Run ``argv`` to completion; never raises for a non-zero exit.

        A missing program is reported as exit code 127, like a shell does. With ``max_output`` (for a command whose
        answer someone else writes: a tenant's pod through ``kubectl exec``) at most that many bytes of stdout and
        :data:`STDERR_KEEP` of stderr's end are held: a command that prints more is killed at once and its result
        says ``too_large``, so a flood costs neither memory nor the whole time-out; ``history`` records such a
        command without its stdout.
        """
        full_env = None
        if env is not None:
            full_env = dict(os.environ)
            full_env.update(env)
        start = time.monotonic()
        if max_output is not None:
            if input_text is not None:
                raise ValueError("max_output does not take input_text")
            result = _run_bounded(argv, timeout if timeout is not None else self.default_timeout, full_env, cwd,
                                  max_output)
            # the record keeps no stdout: one bounded answer per VMI, each up to its limit, would add up in a run
            self.history.append(dataclasses.replace(result, stdout=""))
            return result
        try:
            proc = subprocess.run(
                _with_threads(argv),
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout if timeout is not None else self.default_timeout,
                env=full_env,
                input=input_text,
                cwd=cwd,
                check=False,
                preexec_fn=die_with_parent_preexec(long_lived=False),
            )
            result = CommandResult(
                tuple(argv), proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start
            )
        except FileNotFoundError as exc:
            result = CommandResult(
                tuple(argv), 127, "", f"{argv[0]}: not found ({exc.strerror})", time.monotonic() - start
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            result = CommandResult(tuple(argv), -1, out, err, time.monotonic() - start, timed_out=True)
        self.history.append(result)
        return result

    def popen(
        self,
        argv: Sequence[str],
        **kwargs: object,
    ) -> subprocess.Popen[bytes]:
        """Start a long-lived process (QEMU, daemons); it dies with kvmtune. Recorded with returncode -2 (running)."""
        if "preexec_fn" in kwargs:
            raise TypeError("Runner.popen sets preexec_fn itself (the child dies with kvmtune)")
        self.history.append(CommandResult(tuple(argv), -2, "", "", 0.0))
        return subprocess.Popen(_with_threads(argv), preexec_fn=die_with_parent_preexec(), **kwargs)  # type: ignore[call-overload,no-any-return]


STDERR_KEEP = 64 * 1024  # the end of a bounded command's stderr (its last line is what describe_failure says)


def _run_bounded(argv: Sequence[str], timeout: float, env: Mapping[str, str] | None, cwd: str | None,
                 limit: int) -> CommandResult:
    """:meth:`Runner.run` holding at most ``limit`` + 1 bytes of stdout (killed past it) and the last
    :data:`STDERR_KEEP` bytes of stderr."""
    start = time.monotonic()
    try:
        proc = subprocess.Popen(  # argv, no shell: the runner is the one place commands start
            _with_threads(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
            cwd=cwd, preexec_fn=die_with_parent_preexec(long_lived=False))
    except FileNotFoundError as exc:
        return CommandResult(tuple(argv), 127, "", f"{argv[0]}: not found ({exc.strerror})", time.monotonic() - start)
    assert proc.stdout is not None and proc.stderr is not None
    out, err = bytearray(), bytearray()
    too_large = timed_out = False
    deadline = start + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        while sel.get_map() and not too_large:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 1 << 16)
                buf: bytearray = key.data
                if not chunk:
                    sel.unregister(key.fileobj)
                elif buf is out:
                    out += chunk[:limit + 1 - len(out)]
                    too_large = len(out) > limit
                else:
                    err += chunk
                    del err[:-STDERR_KEEP]
    if too_large or timed_out:
        proc.kill()
    try:
        returncode = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:  # both pipes closed, yet it goes on: a daemon's child holds nothing of ours
        proc.kill()
        returncode = proc.wait()
        timed_out = True
    proc.stdout.close()
    proc.stderr.close()
    return CommandResult(tuple(argv), -1 if timed_out else returncode, out.decode(errors="replace"),
                         err.decode(errors="replace"), time.monotonic() - start, timed_out=timed_out,
                         too_large=too_large)


_default: Runner | None = None


def default_runner() -> Runner:
    global _default
    if _default is None:
        _default = Runner()
    return _default
