"""``kvmtune config``: the effective settings and where each value came from; check a settings file."""

from __future__ import annotations

import argparse
import json
from datetime import date
from typing import Any, TextIO

from kvmtune.audit.settings import KEYS, Settings, load
from kvmtune.cli.command import Command, Exit, Outcome, format_option, settings_of
from kvmtune.textsafe import safe


class ConfigShow(Command):
    name = "show"
    help = "print the effective settings and where each value came from"
    uses_settings = True

    def options(self, p: argparse.ArgumentParser) -> None:
        format_option(p, ("text", "json"))

    def run(self, args: argparse.Namespace) -> Outcome:
        return Outcome(Exit.OK, settings_of(args))

    def render(self, outcome: Outcome, fmt: str, out: TextIO, *, color: bool) -> None:
        s = outcome.result
        assert isinstance(s, Settings)
        if fmt == "json":
            out.write(json.dumps(_as_json(s), indent=2, default=str) + "\n")
            return
        out.write(f"# files read: {', '.join(safe(f) for f in s.files) if s.files else 'none'}\n")
        width = max(len(k.name) for k in KEYS)
        for key in KEYS:
            v = s.values[key.name]
            shown = json.dumps(v.value) if v.value is not None else "(unset)"
            out.write(f"{key.name:{width}} = {safe(shown):20}  # {safe(v.origin)}\n")
        today = date.today()
        for w in s.waivers:
            until = f" until {w.expires.isoformat()}" if w.expires else ""
            if _expired(w.expires, today):  # it waives nothing any more: say so where the operator looks
                assert w.expires is not None
                until = f" EXPIRED {w.expires.isoformat()} (waives nothing; its findings count again)"
            by = f" by {w.by}" if w.by else ""
            out.write(f"waiver {safe(w.label())}: {safe(w.reason)}{until}{safe(by)}\n")


class ConfigCheck(Command):
    name = "check"
    help = "check a settings file without running anything (exit 2, one FILE:LINE line per mistake)"

    def options(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("file", metavar="FILE", help="the settings file (TOML)")

    def run(self, args: argparse.Namespace) -> Outcome:
        s = load([(args.file, True)])
        given = sum(1 for k in KEYS if s.given(k.name))
        return Outcome(Exit.OK, f"{safe(args.file)}: OK ({given} setting(s), {len(s.waivers)} waiver(s))\n")


class ConfigCommand(Command):
    name = "config"
    help = "show the effective settings, or check a settings file"
    description = ("kvmtune reads --config FILE, else $KVMTUNE_CONFIG, else /etc/kvmtune/kvmtune.toml then "
                   "~/.config/kvmtune/kvmtune.toml (the later overriding the earlier key by key). docs/settings.md")
    subcommands = (ConfigShow, ConfigCheck)


COMMANDS = (ConfigCommand,)


def _expired(expires: date | None, today: date) -> bool:
    """A waiver waives up to and including its ``expires`` day (docs/settings.md)."""
    return expires is not None and expires < today


def _as_json(s: Settings) -> dict[str, Any]:
    today = date.today()
    return {
        "files": s.files,
        "settings": {k.name: {"value": s.values[k.name].value, "from": s.values[k.name].origin} for k in KEYS},
        "waivers": [{**w.to_json(), "expired": _expired(w.expires, today)} for w in s.waivers],
    }
