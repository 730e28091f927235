"""Command-line entry point. Each subcommand is a :class:`~kvmtune.cli.command.Command` in its own module
(listed in the module's ``COMMANDS``); :func:`main` owns what every command shares: usage errors, the output
file, colour, error lines and the exit code (:class:`~kvmtune.cli.command.Exit`)."""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from kvmtune import version_line
from kvmtune.audit.settings import load, search_paths
from kvmtune.cli.command import Command, Exit, Outcome, register, settings_options, use_color
from kvmtune.errors import KvmtuneError, UsageError
from kvmtune.fix.files import write_output
from kvmtune.textsafe import safe

# Subcommand modules, in the order `kvmtune --help` lists them.
COMMAND_MODULES = [
    "kvmtune.cli.audit",
    "kvmtune.cli.rules",
    "kvmtune.cli.fix",
    "kvmtune.cli.verify",
    "kvmtune.cli.undo",
    "kvmtune.cli.ksm",
    "kvmtune.cli.capture_host",
    "kvmtune.cli.guest",
    "kvmtune.cli.bench",
    "kvmtune.cli.results",
    "kvmtune.cli.compare",
    "kvmtune.cli.report",
    "kvmtune.cli.net",
    "kvmtune.cli.top",
    "kvmtune.cli.why",
    "kvmtune.cli.doctor",
    "kvmtune.cli.shelldocs",
    "kvmtune.cli.config",
]



class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(Exit.USAGE, f"kvmtune: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvmtune", description="Audit, fix and benchmark KVM guests and hosts.")
    parser.add_argument("--version", action="version", version=version_line())
    settings_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        for cls in module.COMMANDS:
            register(sub, cls)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command: Command | None = getattr(args, "command_object", None)
    if command is None:
        parser.print_help()
        return Exit.USAGE
    try:
        if command.uses_settings:  # a bad settings file is one line naming it, exit 2, before anything runs
            if args.config is not None and args.no_config:
                print("kvmtune: error: --config and --no-config exclude each other", file=sys.stderr)
                return Exit.USAGE
            args.settings = load(search_paths(args.config, os.environ, no_config=args.no_config))
        try:
            command.check(args)
        except UsageError as exc:
            print(f"kvmtune: error: {safe(exc)}", file=sys.stderr)
            return Exit.USAGE
        outcome = command.run(args)
        _emit(command, outcome, args)
        for err in outcome.errors:
            print(f"kvmtune: {safe(err)}", file=sys.stderr)
        return int(outcome.exit)
    except KvmtuneError as exc:
        print(f"kvmtune: {safe(exc)}", file=sys.stderr)
        return Exit.USAGE
    except KeyboardInterrupt:
        print("kvmtune: interrupted", file=sys.stderr)
        return Exit.INTERRUPTED
    except BrokenPipeError:
        # the reader went away (`| head`): files were written before stdout (see report); keep the
        # interpreter from printing a second error while flushing the closed pipe at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return Exit.OK
    except OSError as exc:
        # a file a command was told to read or write (--db, -o, a directory) that the system refused
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"kvmtune: {safe(where)}{safe(exc.strerror or exc)}", file=sys.stderr)
        return Exit.USAGE


def _emit(command: Command, outcome: Outcome, args: argparse.Namespace) -> None:
    """The outcome's result, rendered to ``--output`` (atomically, through the one writer) or standard output."""
    if outcome.result is None:
        return
    fmt = str(getattr(args, "format", None) or "text")
    output: Path | None = getattr(args, "output", None)
    if output is not None and str(output) != "-":
        try:
            write_output(Path(output), lambda fh: command.render(outcome, fmt, fh, color=False), tag=str(os.getpid()))
        except OSError as exc:
            raise UsageError(f"{output}: cannot write the report ({exc.strerror or exc})") from None
        return
    color = use_color(str(getattr(args, "color", "never")), sys.stdout.isatty())
    command.render(outcome, fmt, sys.stdout, color=color)


def terminal_width() -> int | None:
    """Columns of the terminal standard output is, or ``None`` when it is not one."""
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


if __name__ == "__main__":
    sys.exit(main())
