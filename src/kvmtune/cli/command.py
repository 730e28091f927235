"""One command shape for every subcommand (asv's ``commands/*.py`` is the model).

A subcommand is a :class:`Command` subclass in its own module under ``cli/``, listed in that module's
``COMMANDS``. It declares its options (the shared ones come from the ``*_option`` helpers below, so
``--root``, ``--format``, ``--output``, ``--color``, ``--db`` and ``--journal-dir`` mean one thing
everywhere), ``check(args)`` raises :class:`~kvmtune.errors.UsageError` for arguments that cannot be
used, ``run(args)`` does the work and returns an :class:`Outcome` (it never writes to ``args``), and
``render(outcome, fmt, out, …)`` turns the outcome into the output format asked for.

:func:`kvmtune.cli.main` owns the rest, once: usage errors (one line, exit 2), the output file (through
the one :func:`~kvmtune.fix.files.write_output`), ``NO_COLOR`` and ``--color``, the error lines an
outcome carries, and the exit code, one of :class:`Exit`.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TextIO

from kvmtune.errors import UsageError

if TYPE_CHECKING:  # imported where used: `import kvmtune.cli` stays light (bench/startup/run.py)
    from kvmtune.audit.settings import Settings


class Exit(IntEnum):
    """kvmtune's exit codes (README, "Exit codes")."""

    OK = 0
    FINDINGS = 1  # the answer is "not good": findings at --fail-on, problems found, failed cells, a "no" to a prompt
    USAGE = 2  # arguments or inputs that cannot be used, refused with one line; nothing changed
    INCOMPLETE = 3  # part of the work failed after it began (a fix stopped part-way, an experiment failed)
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)


@dataclass
class Outcome:
    """What :meth:`Command.run` hands back: the exit code, what :meth:`Command.render` formats (``None``:
    the command already said all it had to, e.g. a progress stream), and error lines for stderr."""

    exit: Exit = Exit.OK
    result: object = None
    errors: list[str] = field(default_factory=list)


class Command:
    """One subcommand. Subclasses set ``name`` and ``help`` and override what they need."""

    name: ClassVar[str]
    help: ClassVar[str]
    description: ClassVar[str | None] = None
    # nested actions (``kvmtune results list``); a command with them and none given prints its help
    subcommands: ClassVar[tuple[type[Command], ...]] = ()
    # reads the settings file (main loads it before check(); the command reads it with settings_of(args))
    uses_settings: ClassVar[bool] = False
    parser: argparse.ArgumentParser  # set when registered

    def options(self, p: argparse.ArgumentParser) -> None:
        """Add this command's options to ``p``."""

    def check(self, args: argparse.Namespace) -> None:
        """Raise :class:`UsageError` for arguments that cannot be used together (argparse checks the rest)."""

    def run(self, args: argparse.Namespace) -> Outcome:
        """Do the work; never assign to ``args``."""
        return Outcome(Exit.USAGE, self.parser.format_help())

    def render(self, outcome: Outcome, fmt: str, out: TextIO, *, color: bool) -> None:
        """Write ``outcome.result`` to ``out`` in ``fmt``; the default writes text results as they are."""
        if isinstance(outcome.result, str):
            out.write(outcome.result)


def register(sub: argparse._SubParsersAction[Any], cls: type[Command]) -> Command:
    """Add ``cls`` (and its subcommands) to the subparsers ``sub``."""
    command = cls()
    p = sub.add_parser(cls.name, help=cls.help, description=cls.description or cls.help)
    command.parser = p
    command.options(p)
    settings_options(p, suppress=True)
    p.set_defaults(command_object=command)
    if cls.subcommands:
        nested = p.add_subparsers(dest=f"{cls.name}_action", metavar="ACTION", parser_class=type(p))
        for child in cls.subcommands:
            register(nested, child)
    return command


# -- the options that mean one thing everywhere ------------------------------------------------------------


def existing_dir(text: str) -> str:
    """``--root DIR``: an existing directory, made absolute (journals and reports hold absolute paths only)."""
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text}: not a directory")
    return os.path.realpath(text)


def root_option(p: argparse.ArgumentParser, help: str = "read /proc, /sys, /etc below DIR (a captured host)") -> None:
    p.add_argument("--root", type=existing_dir, default="/", metavar="DIR", help=help)


def format_option(p: argparse.ArgumentParser, choices: tuple[str, ...], default: str = "text", help: str | None = None) -> None:
    """``--format``: always the output format (an image format is ``--image-format``)."""
    p.add_argument("--format", choices=choices, default=default, help=help or f"output format (default {default})")


def output_option(p: argparse.ArgumentParser, help: str = "write the report to FILE (atomically; - is standard output)") -> None:
    p.add_argument("-o", "--output", metavar="FILE", type=Path, default=None, help=help)


def color_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colour the text output (auto: on a terminal, unless NO_COLOR is set)")


def db_option(p: argparse.ArgumentParser) -> None:
    """``--db FILE``; a command with it sets ``uses_settings`` and opens :func:`results_db`."""
    from kvmtune.lab.workdir import default_db

    p.add_argument("--db", type=Path, default=None, metavar="FILE",
                   help=f"results database (default: the settings file's db, else {default_db()})")


def results_db(args: argparse.Namespace) -> Path:
    """The results database: ``--db``, else the settings file's ``db``, else :func:`default_db`."""
    from kvmtune.lab.workdir import default_db

    if args.db is not None:
        return Path(args.db)
    settings = settings_of(args)
    return Path(str(settings.get("db"))) if settings.given("db") else default_db()


def results_db_named(args: argparse.Namespace) -> bool:
    """Whether ``--db`` or the settings file named the database (so it must exist where a command reads it)."""
    return args.db is not None or settings_of(args).given("db")


def journal_dir_option(p: argparse.ArgumentParser, default: str, env: str) -> None:
    p.add_argument("--journal-dir", default=None, metavar="DIR", help=f"where journals are (default ${env} or {default})")


def settings_options(p: argparse.ArgumentParser, *, suppress: bool = False) -> None:
    """``--config FILE`` and ``--no-config``, before or after the subcommand (after it, they win)."""
    default: object = argparse.SUPPRESS if suppress else None
    p.add_argument("--config", metavar="FILE", default=default,
                   help="read settings from FILE only (default: $KVMTUNE_CONFIG, else /etc/kvmtune/kvmtune.toml "
                   "then ~/.config/kvmtune/kvmtune.toml)")
    p.add_argument("--no-config", action="store_true", default=argparse.SUPPRESS if suppress else False,
                   help="read no settings file")


def settings_of(args: argparse.Namespace) -> Settings:
    """The effective settings main() loaded for this command (the defaults when it loaded none)."""
    from kvmtune.audit.settings import Settings

    found = getattr(args, "settings", None)
    return found if isinstance(found, Settings) else Settings()


def settings_journal_dir(args: argparse.Namespace) -> str | None:
    """``--journal-dir``, else the settings file's ``journal_dir`` for this host (not below a ``--root`` tree,
    whose journals stay in it, nor over ``$KVMTUNE_JOURNAL_DIR``); ``None``: the journal's own default."""
    if args.journal_dir:
        return str(args.journal_dir)
    settings = settings_of(args)
    if os.environ.get("KVMTUNE_JOURNAL_DIR") or not settings.given("journal_dir") or getattr(args, "root", "/") != "/":
        return None
    return str(settings.get("journal_dir"))


def use_color(choice: str, to_terminal: bool) -> bool:
    """``--color``: always and never win; auto colours a terminal unless ``NO_COLOR`` (no-color.org) is set."""
    if choice == "always":
        return True
    return choice == "auto" and to_terminal and not os.environ.get("NO_COLOR")


def usage(message: str) -> UsageError:
    """A usage error for ``raise`` in :meth:`Command.check`."""
    return UsageError(message)
