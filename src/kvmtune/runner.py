"""The one place where kvmtune runs external commands.

Every call is recorded (argv, exit code, duration, the tail of stderr) so
reports and bug reports can say exactly what was run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

STDERR_TAIL = 2000


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    @property
    def stderr_tail(self) -> str:
        return self.stderr[-STDERR_TAIL:]

    def describe_failure(self) -> str:
        """One line: what ran and why it failed."""
        cmd = " ".join(self.argv[:3]) + (" …" if len(self.argv) > 3 else "")
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
    ) -> CommandResult:
        """Run ``argv`` to completion; never raises for a non-zero exit.

        A missing program is reported as exit code 127, like a shell does.
        """
        full_env = None
        if env is not None:
            full_env = dict(os.environ)
            full_env.update(env)
        start = time.monotonic()
        try:
            proc = subprocess.run(
                list(argv),
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout if timeout is not None else self.default_timeout,
                env=full_env,
                input=input_text,
                cwd=cwd,
                check=False,
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
        """Start a long-lived process (QEMU, daemons). Recorded with returncode -2 (still running)."""
        self.history.append(CommandResult(tuple(argv), -2, "", "", 0.0))
        return subprocess.Popen(list(argv), **kwargs)  # type: ignore[call-overload,no-any-return]


_default: Runner | None = None


def default_runner() -> Runner:
    global _default
    if _default is None:
        _default = Runner()
    return _default
