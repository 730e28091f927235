"""Command-line entry point. Each subcommand lives in its own module with
``register(subparsers)``; the module sets ``func`` on its parser, and
``func(args) -> int`` returns the exit code."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from kvmtune import __version__
from kvmtune.errors import KvmtuneError
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
    "kvmtune.cli.doctor",
    "kvmtune.cli.shelldocs",
]

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"kvmtune: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvmtune", description="Audit, fix and benchmark KVM guests and hosts.")
    parser.add_argument("--version", action="version", version=f"kvmtune {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        code: int = args.func(args)
        return code
    except KvmtuneError as exc:
        print(f"kvmtune: {safe(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("kvmtune: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`| head`): files were written before stdout (see report); keep the
        # interpreter from printing a second error while flushing the closed pipe at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except OSError as exc:
        # a file a command was told to read or write (--db, -o, a directory) that the system refused
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"kvmtune: {where}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
