"""kvmtune's settings file (TOML): the options people repeat, thresholds sites disagree on, and waivers.

Found as operators expect: ``--config FILE``, else ``$KVMTUNE_CONFIG``, else ``/etc/kvmtune/kvmtune.toml``
then ``~/.config/kvmtune/kvmtune.toml`` (``$XDG_CONFIG_HOME``), the later overriding the earlier key by key;
``--no-config`` reads none. A settings file can waive findings and name paths, so one that another user
can write, or that is owned by neither root nor the invoking user, is refused.

Every key is checked: an unknown key, a wrong type, an unknown rule id, a waiver without a reason or an
``expires`` that is not a date is one error naming the file and the line (``tomllib`` knows lines only for
syntax errors, so the line of a key is found by scanning the file). A typo never silently widens what passes.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

from kvmtune.audit.finding import Severity, Waiver
from kvmtune.audit.rule import all_rules
from kvmtune.audit.thresholds import Thresholds
from kvmtune.errors import InputError
from kvmtune.inputs import read_private

MAX_BYTES = 1024 * 1024
SYSTEM_FILE = "/etc/kvmtune/kvmtune.toml"
ENV = "KVMTUNE_CONFIG"

Check = Callable[[object], str | None]  # None: fine; else what is wrong (e.g. "expected a number")


@dataclass(frozen=True)
class Key:
    """One setting: its default, where that default comes from, and how a value is checked."""

    name: str  # dotted for a table: thresholds.vcpu_overcommit
    default: object
    source: str  # where the default comes from
    check: Check
    help: str


def _string(v: object) -> str | None:
    return None if isinstance(v, str) and v else "expected a non-empty string"


def _strings(v: object) -> str | None:
    if isinstance(v, list) and all(isinstance(x, str) and x for x in v):
        return None
    return 'expected a list of strings (e.g. ["KVM-STO-004"])'


def _number(low: float, high: float, *, at_least: bool = False) -> Check:
    """A number in (low, high], or [low, high] with ``at_least`` (as the command-line option takes it)."""
    def check(v: object) -> str | None:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return "expected a number"
        if (low <= float(v) if at_least else low < float(v)) and float(v) <= high:
            return None
        return f"{v} is out of range (give {'at least' if at_least else 'more than'} {low:g}, at most {high:g})"
    return check


def _absolute_path(v: object) -> str | None:
    if not isinstance(v, str) or not v:
        return "expected a non-empty string (an absolute path)"
    return None if os.path.isabs(v) else f"{v!r} is not an absolute path (a timer's working directory is not yours)"


def _severity(v: object) -> str | None:
    if not isinstance(v, str):
        return "expected a severity string (info, low, medium, high, critical)"
    try:
        Severity.parse(v)
    except ValueError as exc:
        return str(exc)
    return None


def _profile(v: object) -> str | None:
    from kvmtune.host.settings import PROFILES

    if isinstance(v, str) and v in PROFILES:
        return None
    return f"expected one of {', '.join(PROFILES)}"


def _rules(v: object) -> str | None:
    wrong = _strings(v)
    if wrong:
        return wrong
    assert isinstance(v, list)
    for key in v:
        problem = unknown_rule(key, slugs=True)
        if problem:
            return problem
    return None


KEYS: tuple[Key, ...] = (
    Key("fail_on", None, "unset: no finding fails the run", _severity, "audit --fail-on: exit 1 at or above this severity"),
    Key("only", [], "unset: every rule", _rules, "audit/fix --only: rule ids, slugs or prefixes"),
    Key("skip", [], "unset: no rule", _rules, "audit/fix --skip: rule ids, slugs or prefixes"),
    Key("profile", "virtual-host", "fix --host's default profile (host/settings.py)", _profile, "fix --host --profile"),
    Key("journal_dir", "/var/lib/kvmtune/journal", "fix/journal.py DEFAULT_DIR", _string, "fix/undo --journal-dir"),
    Key("db", None, "unset: $XDG_DATA_HOME/kvmtune/results.db, else ~/.local/share/kvmtune/results.db "
        "(lab/workdir.py default_db)", _absolute_path,
        "--db of bench, results, compare, report and verify: the results database"),
    Key("connect", [], "unset: what this host runs", _strings, "libvirt URIs audit reads when no input is named"),
    Key("agent_timeout", 5.0, "audit/collect_agent.py DEFAULT_TIMEOUT_S", _number(0, 600),
        "audit --agent-timeout: seconds per guest agent"),
    Key("thresholds.vcpu_overcommit", 4.0, "OpenStack Nova initial_cpu_allocation_ratio 4.0 (since 2022)",
        _number(0, 1000), "KVM-HST-019: running vCPUs per host CPU above which it is reported"),
    Key("thresholds.cpu_utilization", 0.80, "seed 000: target system use at 80 % or lower", _number(0, 1),
        "KVM-HST-018 and the live host CPU signal's warn level: fraction of all host CPUs"),
    Key("thresholds.memory_overcommit", 1.0, "OpenStack Nova initial_ram_allocation_ratio 1.0 (since 2022)",
        _number(0, 100), "KVM-HST-020: guest memory / host RAM above which it is reported"),
    Key("thresholds.run_delay_warn", 0.05, "live/symptoms.py: VMware's CPU Ready guidance (5 % per vCPU worth a look)",
        _number(0, 1), "top/sample: run delay, fraction of the interval per vCPU, that warns"),
    Key("thresholds.run_delay_critical", 0.10, "live/symptoms.py: VMware's CPU Ready guidance (10 % a problem)", _number(0, 1),
        "top/sample: run delay per vCPU that is critical"),
    Key("thresholds.disk_latency_flash_ms", 2.0, "live/symptoms.py: storage vendors' knowledge-base guidance, flash",
        _number(0, 10000),
        "top/sample: disk latency on flash that warns"),
    Key("thresholds.disk_latency_hdd_ms", 10.0, "live/symptoms.py: storage vendors' guidance, HDD or network storage",
        _number(0, 10000), "top/sample: disk latency on HDD or network storage that warns"),
    Key("verify.threshold", 5.0, "docs/verdicts.md 'The bands': a fix's band is ±5 % (verify/measure.py judge)",
        _number(0, 100), "verify --threshold: the band, in %, a fix's B/A interval must clear to help or hurt"),
    Key("verify.finding_budget", 30.0, "docs/verify.md: a finding noise cannot settle took 409 s of a 60 s-capped "
        "--examples run, hence 30 s", _number(1, 86400, at_least=True),
        "verify --finding-budget: seconds one finding may add A/B rounds until its verdict settles"),
    Key("verify.budget", None, "unset: no cap on the whole run", _number(1, 7 * 86400, at_least=True),
        "verify --budget: seconds the whole run may take; what does not fit is listed as skipped"),
)
KEY_NAMES = {k.name: k for k in KEYS}
WAIVER_KEYS = ("rule", "reason", "host", "guest", "target", "expires", "by")
TABLES = ("thresholds", "verify")


@dataclass(frozen=True)
class Value:
    value: object
    origin: str  # "default (<source>)" or FILE:LINE


@dataclass
class Settings:
    values: dict[str, Value] = field(default_factory=dict)
    waivers: list[Waiver] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # read, in order

    def __post_init__(self) -> None:
        for key in KEYS:
            self.values.setdefault(key.name, Value(key.default, f"default ({key.source})"))

    def get(self, name: str) -> Any:
        return self.values[name].value

    def given(self, name: str) -> bool:
        """Whether a settings file set ``name`` (not its default)."""
        return not self.values[name].origin.startswith("default")

    @property
    def thresholds(self) -> Thresholds:
        return Thresholds(**{k.name.split(".", 1)[1]: float(self.get(k.name)) for k in KEYS
                             if k.name.startswith("thresholds.")})


def waiver_rule(rule: str) -> tuple[str, str | None]:
    """A waiver's ``rule`` as the id (or id prefix) it keeps, and the problem with it, if any: an id, an id prefix
    or a slug, as ``--only`` takes them; a slug prefix only where it names one rule (settings files and
    ``<metadata>`` waivers alike)."""
    problem = unknown_rule(rule, slugs=True)
    if problem or rule.upper().startswith("KVM-"):
        return rule, problem
    ids = sorted(r.id for r in all_rules() if r.slug.startswith(rule.lower()))
    exact = [r.id for r in all_rules() if r.slug == rule.lower()]
    if len(exact) == 1 or len(ids) == 1:
        return (exact or ids)[0], None
    return rule, (f"slug prefix {rule!r} names {len(ids)} rules ({', '.join(ids)}); a waiver names one rule or an "
                  "id prefix")


def unknown_rule(key: str, *, slugs: bool) -> str | None:
    """None when ``key`` names a rule: an id or id prefix (and, with ``slugs``, a slug or slug prefix)."""
    rules = all_rules()
    upper = key.upper()
    if any(r.id.startswith(upper) for r in rules) and key.upper().startswith("KVM-"):
        return None
    if slugs and any(r.slug.startswith(key.lower()) for r in rules):
        return None
    names = [r.id for r in rules] + sorted({r.id[:7] for r in rules}) + ([r.slug for r in rules] if slugs else [])
    import difflib

    close = difflib.get_close_matches(upper if upper.startswith("KVM-") else key.lower(), names, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else " ('kvmtune rules list' shows them)"
    return f"unknown rule id {key!r}{hint}"


# -- finding the files ------------------------------------------------------------------------------------


def search_paths(explicit: str | None, env: Mapping[str, str], *, no_config: bool = False,
                 system: str = SYSTEM_FILE) -> list[tuple[str, bool]]:
    """The files to read, in order, each with whether it must exist (a file named by the user must)."""
    if no_config:
        return []
    if explicit:
        return [(explicit, True)]
    if env.get(ENV):
        return [(env[ENV], True)]
    home = env.get("XDG_CONFIG_HOME") or (os.path.join(env["HOME"], ".config") if env.get("HOME") else "")
    user = [(os.path.join(home, "kvmtune", "kvmtune.toml"), False)] if home else []
    return [(system, False), *user]


def load(paths: Sequence[tuple[str, bool]]) -> Settings:
    """The effective settings of ``paths`` (from :func:`search_paths`): later files override earlier ones
    key by key; waivers add up. :class:`InputError` (one line, file and line) on the first bad one."""
    settings = Settings()
    for path, required in paths:
        if not required and not os.path.lexists(path):
            continue
        values, waivers = read_file(path)
        settings.values.update(values)
        settings.waivers.extend(waivers)
        settings.files.append(path)
    return settings


def check_owner(path: str, st: os.stat_result) -> None:
    """A settings file can waive findings and name paths: only root or the invoking user may have written it."""
    if st.st_uid not in (0, os.geteuid()):
        raise InputError(path, f"settings file owned by uid {st.st_uid}, neither root nor the invoking user "
                         f"(uid {os.geteuid()}); refused")
    if st.st_mode & 0o022:
        raise InputError(path, f"settings file writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
                         "refused")


def read_file(path: str) -> tuple[dict[str, Value], list[Waiver]]:
    """One settings file, checked whole: its values (each with FILE:LINE) and its waivers."""
    # opened once (no link, no FIFO), its directories and the descriptor's owner and mode checked, then read
    raw = read_private(path, MAX_BYTES, " (a settings file)", check=check_owner)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(path, "not UTF-8 text") from None
    import tomllib  # here: most runs find no settings file

    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"\(at line (\d+), column \d+\)", str(exc))
        message = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(exc))
        raise InputError(path, f"not valid TOML: {message}", int(m.group(1)) if m else None) from None
    except RecursionError:  # tomllib recurses per nesting level: a deep list is a line, not a traceback
        raise InputError(path, "TOML nested too deeply to read") from None
    except MemoryError:
        raise InputError(path, "too large to read as TOML") from None
    reader = _Reader(path, text)
    values, waivers = reader.read(doc)
    if reader.errors:
        raise SettingsErrors(reader.errors)
    return values, waivers


MAX_ERRORS = 20  # mistakes of one file reported in one run; the rest are counted


class SettingsErrors(InputError):
    """Every mistake of one settings file (up to :data:`MAX_ERRORS`), each with its FILE:LINE: one run shows
    them all (``kvmtune config check``, any settings load). ``str()`` is the first, with how many follow."""

    def __init__(self, errors: Sequence[InputError]) -> None:
        ordered = sorted(errors, key=lambda e: e.line or 0)
        self.errors: list[InputError] = ordered[:MAX_ERRORS]
        if len(ordered) > MAX_ERRORS:
            self.errors.append(InputError(ordered[0].where, f"{len(ordered) - MAX_ERRORS} more mistake(s) not shown"))
        first = ordered[0]
        more = f" (and {len(ordered) - 1} more mistake(s) in this file)" if len(ordered) > 1 else ""
        super().__init__(first.where, first.problem + more, first.line)


class _Reader:
    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.lines = _key_lines(text)
        self.errors: list[InputError] = []  # every mistake, in the order found; read() goes on past each

    def fail(self, table: str, index: int, key: str, problem: str) -> None:
        line = self.lines.get((table, index, key)) or self.lines.get((table, index, ""))
        self.errors.append(InputError(self.path, problem, line))

    def where(self, table: str, index: int, key: str) -> str:
        line = self.lines.get((table, index, key)) or self.lines.get((table, index, ""))
        return f"{self.path}:{line}" if line else self.path

    def read(self, doc: dict[str, Any]) -> tuple[dict[str, Value], list[Waiver]]:
        values: dict[str, Value] = {}
        waivers: list[Waiver] = []
        for name, value in doc.items():
            if name == "waiver":
                if not isinstance(value, list):
                    self.fail("", 0, name, "waiver: expected [[waiver]] tables")
                    continue
                waivers.extend(w for i, raw in enumerate(value) if (w := self.waiver(i, raw)) is not None)
            elif name in TABLES:
                if not isinstance(value, dict):
                    self.fail("", 0, name, f"{name}: expected a [{name}] table")
                    continue
                for sub, v in value.items():
                    if (checked := self.value(name, f"{name}.{sub}", sub, v)) is not None:
                        values[f"{name}.{sub}"] = checked
            elif (checked := self.value("", name, name, value)) is not None:
                values[name] = checked
        return values, waivers

    def value(self, table: str, dotted: str, key: str, v: object) -> Value | None:
        spec = KEY_NAMES.get(dotted)
        if spec is None:
            known = [k.name.split(".", 1)[1] if table else k.name for k in KEYS if k.name.startswith(f"{table}.")
                     or (not table and "." not in k.name)] + ([] if table else [*TABLES, "waiver"])
            self.fail(table, 0, key, f"unknown key {dotted!r}{_did_you_mean(key, known)}")
            return None
        problem = "wrong type (a date)" if isinstance(v, date) else spec.check(v)
        if problem is not None:
            self.fail(table, 0, key, f"{dotted}: {problem}")
            return None
        return Value(v, self.where(table, 0, key))

    def waiver(self, i: int, w: object) -> Waiver | None:
        """One [[waiver]] table, or None after naming each of its mistakes."""
        if not isinstance(w, dict):
            self.fail("waiver", i, "", "waiver: expected a table")
            return None
        before = len(self.errors)
        for key, v in w.items():
            if key not in WAIVER_KEYS:
                self.fail("waiver", i, key, f"unknown waiver key {key!r}{_did_you_mean(key, WAIVER_KEYS)}")
            elif key != "expires" and not (isinstance(v, str) and v.strip()):
                self.fail("waiver", i, key, f"waiver {key}: expected a non-empty string")
        rule = w.get("rule") if isinstance(w.get("rule"), str) and w["rule"].strip() else None
        if "rule" not in w:
            self.fail("waiver", i, "", "waiver without a rule (an id, id prefix or slug, e.g. rule = \"KVM-STO-004\")")
        if "reason" not in w:
            self.fail("waiver", i, "", f"waiver for {rule or 'a rule'} without a reason (reason = \"why it is accepted\")")
        if rule:
            rule, problem = waiver_rule(rule)
            if problem:
                self.fail("waiver", i, "rule", f"waiver rule: {problem}")
        expires = w.get("expires")
        if expires is not None:
            day = as_date(expires)
            if day is None:
                self.fail("waiver", i, "expires", f"waiver expires: {expires!r} is not a date (YYYY-MM-DD)")
            expires = day
        if len(self.errors) > before:
            return None
        assert rule is not None
        return Waiver(rule=rule.upper(), reason=w["reason"], host=w.get("host"), guest=w.get("guest"),
                      target=w.get("target"), expires=expires, by=w.get("by"), origin=self.where("waiver", i, ""))


def as_date(v: object) -> date | None:
    """A TOML date (or date-time: its day), or a YYYY-MM-DD string; None for anything else."""
    if isinstance(v, datetime):
        return v.date()
    if isinstance(v, date):
        return v
    if isinstance(v, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", v):
        try:
            return date.fromisoformat(v)
        except ValueError:
            return None
    return None


def _did_you_mean(key: str, names: Sequence[str]) -> str:
    import difflib

    close = difflib.get_close_matches(key, list(names), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(names)})"


_HEADER = re.compile(r"^\s*(\[\[?)\s*([A-Za-z0-9_.\-\"' ]+?)\s*\]\]?\s*(?:#.*)?$")
_KEY = re.compile(r"""^\s*("[^"]*"|'[^']*'|[A-Za-z0-9_\-]+)\s*=""")


def _key_lines(text: str) -> dict[tuple[str, int, str], int]:
    """(table, index of an array table, key) -> line number; key "" is a table's header. Keys written
    dotted at the top level (``thresholds.vcpu_overcommit = 5``) count for their table."""
    lines: dict[tuple[str, int, str], int] = {}
    table, counts = "", {"": 0}
    in_string = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.count('"""') % 2 or line.count("'''") % 2:
            in_string = not in_string
            if not in_string:
                continue
        if in_string:
            continue
        header = _HEADER.match(line)
        if header:
            table = header.group(2).strip().strip("\"'")
            index = counts[table] = counts.get(table, -1) + 1 if header.group(1) == "[[" else 0
            lines.setdefault((table, index, ""), n)
            continue
        key = _KEY.match(line)
        if key:
            name = key.group(1).strip("\"'")
            lines.setdefault((table, counts.get(table, 0), name), n)
        else:
            dotted = re.match(r"^\s*([A-Za-z0-9_\-]+)\.([A-Za-z0-9_\-]+)\s*=", line)
            if dotted and not table:
                lines.setdefault((dotted.group(1), 0, dotted.group(2)), n)
    return lines
