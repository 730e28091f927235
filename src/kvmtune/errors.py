"""Errors that reach the user as one line, never as a traceback."""

from __future__ import annotations


class KvmtuneError(Exception):
    """A problem the user can act on. ``str()`` is the whole message."""


class InputError(KvmtuneError):
    """An input (file, URI, argument) that cannot be used.

    ``where`` names the file or URI; ``line`` is set when the parser knows it.
    """

    def __init__(self, where: str, problem: str, line: int | None = None) -> None:
        self.where = where
        self.problem = problem
        self.line = line
        loc = f"{where}:{line}" if line else where
        super().__init__(f"{loc}: {problem}")


class UsageError(KvmtuneError):
    """A command-line option or argument that cannot be used (exit code 2)."""
