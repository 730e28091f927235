"""Command-line entry point. Each subcommand is a :class:`~kvmtune.cli.command.Command` in its own module
(listed in the module's ``COMMANDS``); :func:`main` owns what every command shares: usage errors, the output
file, colour, error lines and the exit code (:class:`~kvmtune.cli.command.Exit`).

Start-up is kept short (``bench/startup/run.py``): :data:`COMMAND_TABLE` names every subcommand, its module
and its help line, so ``kvmtune --help`` lists them all and ``kvmtune --version`` answers without importing a
single subcommand module; a command's module is imported, and its parser built, only when it is the one
invoked. :func:`build_parser` builds them all (completion scripts, the man page, tests).
``tests/architecture/test_cli_shape.py`` fails when the table and the modules' ``COMMANDS`` disagree."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from kvmtune import version_line
from kvmtune.cli.command import Command, Exit, Outcome, register, settings_options, use_color
from kvmtune.errors import KvmtuneError, UsageError
from kvmtune.textsafe import safe

# Every subcommand, in the order `kvmtune --help` lists them: (name, module, help). The help is the
# Command's own ``help``, repeated here so that listing the commands imports none of them.
COMMAND_TABLE: tuple[tuple[str, str, str], ...] = (
    ("audit", "kvmtune.cli.audit", "audit libvirt domains, QEMU command lines and the host"),
    ("rules", "kvmtune.cli.rules", "list the audit rules or explain one"),
    ("fix", "kvmtune.cli.fix",
     "show (and with --apply make) the changes that fix the findings; reversible with 'kvmtune undo'"),
    ("verify", "kvmtune.cli.verify", "prove each fix on this host: measure as it is and as fixed, judge, keep or undo"),
    ("undo", "kvmtune.cli.undo", "restore exactly what a 'kvmtune fix --apply' changed (or list the journals)"),
    ("ksm", "kvmtune.cli.ksm", "show KSM's state, what it saves and what it costs"),
    ("capture-host", "kvmtune.cli.capture_host", "capture the files the host audit reads into a fixture tree"),
    ("guest", "kvmtune.cli.guest", "build the probe guest, detect the accelerator, run it with a load"),
    ("bench", "kvmtune.cli.bench", "measure storage or the network on this host (probe guests + fio / netload)"),
    ("results", "kvmtune.cli.results", "list stored benchmark runs or show one"),
    ("compare", "kvmtune.cli.compare", "compare two benchmark runs cell by cell"),
    ("report", "kvmtune.cli.report", "HTML report (charts, seed verdicts) of benchmark runs; or a fleet report"),
    ("net", "kvmtune.cli.net", "build, check and clean up benchmark network topologies"),
    ("top", "kvmtune.cli.top", "live view: which running guest is slow, and the rule that explains it"),
    ("sample", "kvmtune.cli.top", "sample running guests for a while; JSON or Prometheus textfile output"),
    ("capacity", "kvmtune.cli.top", "seed 001's sizing: how many such guests each disk carries"),
    ("capture", "kvmtune.cli.capture",
     "record a running guest's own disk I/O from the host into a workload file (or --show one)"),
    ("why", "kvmtune.cli.why", "why one running guest is slow: where its time went, who took it, the rule and the fix"),
    ("canary", "kvmtune.cli.canary", "drift canary: measure the stack, compare with this host's baseline, name what changed"),
    ("doctor", "kvmtune.cli.doctor", "what this host can measure: KVM, vhost-net, OVS, qemu-storage-daemon, fio, space"),
    ("completion", "kvmtune.cli.shelldocs", "print a shell completion script (bash, zsh or fish)"),
    ("man", "kvmtune.cli.shelldocs", "print the kvmtune(8) man page (roff)"),
    ("config", "kvmtune.cli.config", "show the effective settings, or check a settings file"),
)

# Subcommand modules, in the order `kvmtune --help` lists them.
COMMAND_MODULES = list(dict.fromkeys(module for _, module, _ in COMMAND_TABLE))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(Exit.USAGE, f"kvmtune: error: {message}\n")


if TYPE_CHECKING:
    _SubParsersAction = argparse._SubParsersAction[argparse.ArgumentParser]
else:  # not subscriptable at run time
    _SubParsersAction = argparse._SubParsersAction


class _Subcommands(_SubParsersAction):
    """The subcommands of :data:`COMMAND_TABLE`, listed (``--help``, the choices of a usage error) from the
    table alone; a command's module is imported and its parser built when :meth:`load` asks, which parsing
    does for the one command given."""

    _pending: dict[str, str]  # name -> module, for the commands whose parser is not built yet

    def declare(self, name: str, module: str, help: str) -> None:
        if not hasattr(self, "_pending"):
            self._pending = {}
        self._choices_actions.append(self._ChoicesPseudoAction(name, (), help))
        self._name_parser_map[name] = _NOT_BUILT  # a choice now; its parser comes with load()
        self._pending[name] = module

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        if name not in getattr(self, "_pending", {}):
            return super().add_parser(name, **kwargs)
        kwargs.pop("help", None)  # listed already, from the table
        choices = self._name_parser_map  # the same dict is the action's choices: edit it in place
        order = list(choices)
        del choices[name]  # argparse refuses a name it has
        parser = super().add_parser(name, **kwargs)
        built = {key: choices[key] for key in order}  # back in the table's place
        choices.clear()
        choices.update(built)
        return parser

    def load(self, name: str) -> None:
        module_name = self._pending.get(name)
        if module_name is None:
            return
        module = __import__(module_name, fromlist=["COMMANDS"])  # unlike importlib's, `-X importtime` reports it
        cls = next((c for c in module.COMMANDS if c.name == name), None)
        if cls is None:
            raise RuntimeError(f"{module_name} has no command {name!r} (COMMAND_TABLE in kvmtune.cli)")
        register(self, cls)
        del self._pending[name]

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        self.load(values[0])  # the command's name, one of the choices (argparse checked it)
        super().__call__(parser, namespace, values, option_string)


_NOT_BUILT: Any = None


class _Version(argparse._VersionAction):
    """``--version``: the build stamp is read when it is asked for, not on every start."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        self.version = version_line()
        super().__call__(parser, namespace, values, option_string)


def _root_parser() -> tuple[argparse.ArgumentParser, _Subcommands]:
    parser = _Parser(prog="kvmtune", description="Audit, fix and benchmark KVM guests and hosts.")
    parser.add_argument("--version", action=_Version)
    settings_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser, action=_Subcommands)
    assert isinstance(sub, _Subcommands)
    for name, module, help in COMMAND_TABLE:
        sub.declare(name, module, help)
    return parser, sub


def build_parser() -> argparse.ArgumentParser:
    """The whole parser, every subcommand's module imported and its parser built (completion, man, tests)."""
    parser, sub = _root_parser()
    for name, _, _ in COMMAND_TABLE:
        sub.load(name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser, _ = _root_parser()  # the command given is loaded as it is parsed, no other
    args = parser.parse_args(argv)
    command: Command | None = getattr(args, "command_object", None)
    if command is None:
        parser.print_help()
        return Exit.USAGE
    try:
        if command.uses_settings:  # a bad settings file is one line naming it, exit 2, before anything runs
            from kvmtune.audit.settings import load, search_paths

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
        for line in getattr(exc, "errors", None) or [exc]:  # a settings file's mistakes: one line each
            print(f"kvmtune: {safe(line)}", file=sys.stderr)
        return Exit.USAGE
    except (RecursionError, MemoryError) as exc:
        # an input nested or sized past what could be read, where no reader said which (each names its file):
        # still one line and exit 2, never a traceback whose exit 1 CI reads as "findings"
        print(f"kvmtune: an input was nested too deeply or too large to read ({type(exc).__name__}); "
              "nothing judged", file=sys.stderr)
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
    also: list[tuple[str, Path]] = list(getattr(args, "also", None) or [])  # audit --also FORMAT=FILE
    if (output is not None and str(output) != "-") or also:
        from kvmtune.fix.files import write_output

        targets = ([(fmt, Path(output))] if output is not None and str(output) != "-" else []) + also
        for form, path in targets:  # one outcome, each rendering written atomically
            def write(fh: TextIO, form: str = form) -> None:
                command.render(outcome, form, fh, color=False)

            try:
                write_output(path, write, tag=str(os.getpid()))
            except OSError as exc:
                raise UsageError(f"{path}: cannot write the report ({exc.strerror or exc})") from None
        if output is not None and str(output) != "-":
            return
    color = use_color(str(getattr(args, "color", "never")), sys.stdout.isatty())
    command.render(outcome, fmt, sys.stdout, color=color)


def terminal_width() -> int | None:
    """Columns of the terminal standard output is, or ``None`` when it is not one."""
    import shutil

    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


if __name__ == "__main__":
    sys.exit(main())
