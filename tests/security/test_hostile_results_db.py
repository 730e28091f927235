"""Issue 29 items 6-8: a results database is someone else's file (``--db``, a shared path), and what it or a
domain's XML holds reaches root's terminal. Every test runs the real CLI in a subprocess with a timeout, so
a hang fails the test instead of the suite."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from kvmtune.errors import KvmtuneError
from kvmtune.lab import store as store_mod
from kvmtune.lab.store import FLEET_SCHEMA, SCHEMA, SCHEMA_VERSION, Store

ESC = "\x1b"
EVIL = f"db01\nKVM-STO-004 db01 forged: HELPS; kept{ESC}]0;owned\x07\u202e\x9b"
RUN_COLUMNS = "id, started, finished, kind, preset, status, accel, env, args, note, owner_pid, owner_start, owner_boot"


def kvmtune(*argv: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """The CLI as root runs it; ``subprocess.TimeoutExpired`` (a hang) fails the test."""
    return subprocess.run([sys.executable, "-m", "kvmtune", *argv], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout, check=False)


def one_line_error(res: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stdout[-300:], res.stderr[-600:])
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr[-600:]
    assert len(res.stdout) < 1000
    for needle in needles:
        assert needle in res.stderr, res.stderr


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def real_db(path: Path, runs: int = 2) -> Path:
    """A database kvmtune wrote: storage runs of two cells each."""
    with Store(path) as st:
        for _ in range(runs):
            rid = st.begin_run("storage", {"accel": "tcg", "qemu": "8.2"}, {"runtime": 1})
            for rep in range(2):
                st.add_cell(rid, "virtio-blk/none|randread", {"bus": "virtio-blk"}, "randread", "ok",
                            {"iops": 100.0 + rep}, rep=rep, accel="tcg")
            st.finish_run(rid, "complete")
    return path


def hostile(path: Path, statements: str, version: int = SCHEMA_VERSION, without: str = "") -> Path:
    """The benchmark tables (less ``without``) plus ``statements``, at schema ``version``."""
    schema = SCHEMA
    if without:
        start = schema.index(f"CREATE TABLE {without} (")
        schema = schema[:start] + schema[schema.index(");", start) + 2:]
    con = sqlite3.connect(path)
    con.executescript(schema + statements + f"; PRAGMA user_version = {version};")
    con.close()
    return path


# ------------------------------------------------------------------ item 8: schema, size, time


def test_a_recursive_view_named_runs_is_refused_not_run(tmp_path: Path) -> None:
    db = hostile(tmp_path / "loop.db", f"CREATE VIEW runs ({RUN_COLUMNS}) AS WITH RECURSIVE r(n) AS "
                 "(SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT n, 0.0, NULL, 'storage', NULL, 'complete', NULL, "
                 "'{}', '{}', NULL, NULL, NULL, NULL FROM r WHERE n = 0", without="runs")  # never a row, never an end
    before = digest(db)
    for argv in (["results", "list"], ["report", "1"], ["compare", "1", "2"], ["results", "show", "1"]):
        one_line_error(kvmtune(*argv, "--db", str(db), timeout=20), str(db), "not a kvmtune results database",
                       "view 'runs'")
    assert digest(db) == before


def test_a_zeroblob_view_is_refused_before_any_row_is_read(tmp_path: Path) -> None:
    db = hostile(tmp_path / "blob.db", f"CREATE VIEW runs ({RUN_COLUMNS}) AS SELECT 1, 0.0, NULL, 'storage', NULL, "
                 "'complete', NULL, '{}', '{}', zeroblob(40000000), NULL, NULL, NULL", without="runs")
    assert db.stat().st_size < 64 * 1024
    one_line_error(kvmtune("results", "list", "--db", str(db)), "not a kvmtune results database")


@pytest.mark.parametrize("extra", [
    "CREATE TRIGGER t AFTER INSERT ON runs BEGIN DELETE FROM cells; END",
    "CREATE TABLE extra (a)",
    "CREATE INDEX sneaky ON cells(length(raw))",
    "CREATE VIEW v AS SELECT 1",
])
def test_foreign_objects_are_refused_and_the_file_is_left_alone(tmp_path: Path, extra: str) -> None:
    """Schema 1 plus one foreign object: no migration, no WAL switch, not one byte written."""
    db = tmp_path / "v1.db"
    con = sqlite3.connect(db)
    con.executescript(SCHEMA.replace(",\n    owner_pid INTEGER,\n    owner_start TEXT,\n    owner_boot TEXT", "")
                      .replace(",\n    attempts INTEGER NOT NULL DEFAULT 1,\n    first_error TEXT", "")
                      + extra + "; PRAGMA user_version = 1;")
    con.close()
    before = digest(db)
    with pytest.raises(KvmtuneError, match="not a kvmtune results database"):
        Store(db)
    assert digest(db) == before and not Path(f"{db}-wal").exists()
    assert sqlite3.connect(db).execute("PRAGMA user_version").fetchone()[0] == 1


def test_a_table_with_other_columns_is_refused(tmp_path: Path) -> None:
    db = hostile(tmp_path / "gen.db", "CREATE TABLE runs (id INTEGER PRIMARY KEY, started REAL NOT NULL, finished REAL, "
                 "kind TEXT NOT NULL, preset TEXT, status TEXT NOT NULL, accel TEXT, args TEXT NOT NULL, note TEXT, "
                 "owner_pid INTEGER, owner_start TEXT, owner_boot TEXT, env TEXT GENERATED ALWAYS AS "
                 "(zeroblob(40000000)))", without="runs")
    one_line_error(kvmtune("results", "list", "--db", str(db)), "table 'runs' is not the one kvmtune creates")


def test_real_databases_still_open_fleet_tables_included(tmp_path: Path) -> None:
    db = real_db(tmp_path / "r.db")
    con = sqlite3.connect(db)
    con.executescript(FLEET_SCHEMA)  # what 'kvmtune report audit.json' adds
    con.close()
    res = kvmtune("results", "list", "--db", str(db))
    assert res.returncode == 0 and res.stdout.count("storage") == 2, res.stderr
    only_fleet = tmp_path / "fleet-first.db"  # a fleet report before any benchmark: schema 0, fleet tables only
    con = sqlite3.connect(only_fleet)
    con.executescript(FLEET_SCHEMA)
    con.close()
    with Store(only_fleet) as st:
        st.begin_run("storage", {}, {})
        assert [r.kind for r in st.runs()] == ["storage"]


def test_a_value_over_the_length_cap_is_one_line(tmp_path: Path) -> None:
    """SQLITE_LIMIT_LENGTH: a note one byte over the cap (a real row holds kilobytes) is refused, not printed."""
    db = real_db(tmp_path / "big.db", runs=1)
    con = sqlite3.connect(db)
    con.execute("UPDATE runs SET note = zeroblob(?)", ((32 << 20) + 1,))
    con.commit()
    con.close()
    for argv in (["results", "list"], ["report", "1"]):
        one_line_error(kvmtune(*argv, "--db", str(db)), "too big")
    assert store_mod.MAX_VALUE_BYTES == 32 << 20


def test_a_runaway_query_is_stopped_by_the_progress_handler(tmp_path: Path) -> None:
    db = real_db(tmp_path / "r.db", runs=1)
    code = (
        "import sqlite3, sys\nfrom pathlib import Path\nimport kvmtune.lab.store as s\n"
        "s.QUERY_TIME_LIMIT_S = 0.5\nst = s.Store(Path(sys.argv[1]))\n"
        "try:\n    st.db.execute('WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) "
        "SELECT count(*) FROM r WHERE n = 0').fetchall()\n"
        "except sqlite3.OperationalError as exc:\n    print(exc)\n"
        "print(len(st.runs()))\n"  # the next statement has its own time
    )
    res = subprocess.run([sys.executable, "-c", code, str(db)], capture_output=True, text=True, timeout=20, check=False)
    assert res.stdout.split() == ["interrupted", "1"], res.stderr[-500:]


def test_run_id_reads_one_row(tmp_path: Path) -> None:
    """``run(1)`` no longer reloads (and parses) every run: a broken run 2 does not stop 'report 1'."""
    db = real_db(tmp_path / "r.db")
    con = sqlite3.connect(db)
    con.execute("UPDATE runs SET env = '[' WHERE id = 2")
    con.commit()
    con.close()
    for argv in (["report", "1"], ["results", "show", "1"]):
        res = kvmtune(*argv, "--db", str(db))
        assert res.returncode == 0 and res.stderr == "", res.stderr[-600:]
    one_line_error(kvmtune("results", "list", "--db", str(db)), "run 2: env is not JSON")


@pytest.mark.parametrize(("sql", "argv", "message"), [
    ("UPDATE runs SET env = '[1, 2]'", ["results", "list"], "env is a JSON list, not an object"),
    ("UPDATE runs SET args = '\"x\"'", ["results", "list"], "args is a JSON str, not an object"),
    ("UPDATE runs SET env = '{\"topologies\": [1, 2]}'", ["results", "show", "1"], "not a list of strings"),
    ("UPDATE runs SET kind = x'1b5b324a'", ["results", "list"], "kind is bytes"),
    ("UPDATE runs SET started = 'yesterday'", ["results", "list"], "started is str"),
    ("UPDATE runs SET started = 1e300", ["results", "list"], "not a time"),
    ("UPDATE cells SET config = '[]'", ["report", "1"], "config is a JSON list"),
    ("UPDATE cells SET config = '{\"tier\": 5}'", ["report", "1"], "config['tier'] is a JSON int"),
    ("UPDATE metrics SET value = 'abc'", ["compare", "1", "2"], "value is str"),
    ("UPDATE cells SET rep = 'x'", ["results", "show", "1"], "rep is str"),
    ("UPDATE runs SET env = '" + "[" * 100_000 + "]" * 100_000 + "'", ["results", "list"], "nested deeper than 32"),
    ("UPDATE cells SET config = '" + '{"a":' * 40 + "1" + "}" * 40 + "'", ["report", "1"], "nested deeper than 32"),
])
def test_wrong_types_and_deep_json_are_one_line(tmp_path: Path, sql: str, argv: list[str], message: str) -> None:
    db = real_db(tmp_path / "r.db")
    con = sqlite3.connect(db)
    con.execute(sql)
    con.commit()
    con.close()
    one_line_error(kvmtune(*argv, "--db", str(db)), str(db), message)


@pytest.mark.parametrize("key", ["iops", "read_fraction", "size_mean", "sequential_fraction", "depth_mean", "depth_p95",
                                 "flush_per_write"])
def test_a_replayed_runs_profile_number_no_float_holds_is_a_dash_not_a_traceback(tmp_path: Path, key: str) -> None:
    """Review round five: a replay's profile (``replay.profile`` of a run's env) with an integer of 400 digits made
    ``report RUN --html`` end in a traceback (``OverflowError`` in ``math.isfinite`` and in the table's division)."""
    db = real_db(tmp_path / "r.db", runs=1)
    con = sqlite3.connect(db)
    profile = {"iops": 588.4, "read_fraction": 0.7, "size_mean": 16384, "sequential_fraction": 0.1, "depth_mean": 7.5,
               "depth_p95": 8, "flush_per_write": 0.5, "size_histogram": [[4096, 10], [16384, 30]]}
    replay = {"digest": "ab" * 32, "source": "iolog", "mode": "timed", "disk": "vda", "profile": profile}
    env = json.dumps({"accel": "tcg", "qemu": "8.2", "replay": replay})
    huge = env.replace(f'"{key}": {json.dumps(profile[key])}', f'"{key}": 1' + "0" * 400)
    assert huge != env
    con.execute("UPDATE runs SET env = ?", (huge,))
    con.commit()
    con.close()
    html = tmp_path / "r.html"
    res = kvmtune("report", "1", "--db", str(db), "--html", str(html))
    assert res.returncode in (0, 1) and "Traceback" not in res.stderr, res.stderr[-600:]
    page = html.read_text()
    shown = {"depth_mean": ">– / 8<", "depth_p95": ">7.5 / –<"}.get(key, ">–<")
    table = page.split("<h2>Replayed workloads</h2>")[1].split("</table>")[0]
    assert shown in table and "1" + "0" * 20 not in page


# ------------------------------------------------------------------ item 7: database strings on the terminal


def assert_escaped(text: str) -> None:
    for bad in (ESC, "\x07", "\u202e", "\x9b", "\r"):
        assert bad not in text, repr(text[-400:])
    assert not any(line.startswith("KVM-STO-004 db01 forged") for line in text.splitlines()), text


def test_results_report_and_compare_escape_database_strings(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    with Store(db) as st:
        for _ in range(2):
            rid = st.begin_run("storage", {"accel": "tcg", "qemu": EVIL}, {}, preset=EVIL)
            for rep in range(2):
                st.add_cell(rid, f"{EVIL}|{EVIL}", {"bus": EVIL}, EVIL, "ok", {"iops": 100.0 + rep}, rep=rep, accel="tcg")
            st.add_cell(rid, f"x|{EVIL}", {}, EVIL, "error", error=EVIL, accel="tcg")
            st.finish_run(rid, "errors", note=EVIL)
        vid = st.begin_run("verify", {"accel": "none"}, {})
        st.add_cell(vid, f"KVM-STO-004|{EVIL}", {"rule": "KVM-STO-004", "target": EVIL, "change": EVIL, "tier": "block",
                    "verdict": "helps", "action": EVIL, "metric": "iops", "unit": EVIL}, "w", "ok",
                    {"before": 1.0, "after": 2.0, "ratio": 2.0})
        st.add_cell(vid, "KVM-STO-002|x", {"rule": "KVM-STO-002", "target": EVIL}, "w", "error", error=EVIL)
        st.finish_run(vid, "errors", note=EVIL)
    for argv in (["results", "list"], ["results", "show", "1"], ["report", "1", "2", "3"], ["compare", "1", "2"]):
        res = kvmtune(*argv, "--db", str(db))
        assert res.returncode in (0, 1) and "Traceback" not in res.stderr, res.stderr[-600:]
        assert_escaped(res.stdout + res.stderr)
        assert "\\x1b]0;owned\\x07" in res.stdout, (argv, res.stdout[-600:])


# ------------------------------------------------------------------ item 6: verify and domain names


def test_verify_escapes_a_domain_name_from_xml(tmp_path: Path) -> None:
    """XML 1.0 lets a <name> carry a newline, U+202E and U+009B as character references (libvirt's own parser
    refuses some of them; kvmtune reads the file). --budget 1 skips every experiment: the lines still print."""
    name = "db01&#10;KVM-STO-004 db01 forged: HELPS; kept&#x202e;&#x9b;&#13;"
    xml = tmp_path / "dom.xml"
    xml.write_text(f"""<domain type='kvm'><name>{name}</name><memory unit='GiB'>1</memory><vcpu>1</vcpu>
      <os><type arch='x86_64' machine='q35'>hvm</type></os><devices>
      <disk type='file' device='disk'><driver name='qemu' type='qcow2' cache='writethrough'/>
      <source file='/nonexistent/x.qcow2'/><target dev='vda' bus='virtio'/></disk></devices></domain>""")
    res = kvmtune("verify", str(xml), "--budget", "1", "--no-store", "--workdir", str(tmp_path / "w"), timeout=60)
    assert res.returncode in (0, 2, 3), res.stderr[-600:]
    assert "Traceback" not in res.stderr
    assert "db01\\x0aKVM-STO-004 db01 forged" in res.stdout, res.stdout
    assert_escaped(res.stdout + res.stderr)


def test_verify_lines_of_measured_and_failed_experiments_are_escaped(tmp_path: Path) -> None:
    """What ``kvmtune verify`` prints for an experiment that ran (or failed): its line, its notes, the run's notes."""
    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.engine import run_rules
    from kvmtune.domain.xml import guest_from_tree, parse_xml_bytes
    from kvmtune.host.root import HostRoot
    from kvmtune.runner import Runner
    from kvmtune.verify.engine import plan_all, render_text, subjects
    from kvmtune.verify.experiments import VerifyContext

    xml = (b"<domain type='kvm'><name>db01&#10;KVM-STO-004 db01 forged: HELPS; kept&#x202e;</name><memory>1048576</memory>"
           b"<vcpu>1</vcpu><os><type arch='x86_64' machine='q35'>hvm</type></os><devices><disk type='file' device='disk'>"
           b"<driver name='qemu' type='qcow2' cache='writethrough'/><source file='/nonexistent/x.qcow2'/>"
           b"<target dev='vda' bus='virtio'/></disk></devices></domain>")
    guest = guest_from_tree(parse_xml_bytes(xml, "t.xml"), "t.xml", "xml")
    findings = run_rules(AuditContext(host=HostRoot("/")), [guest])
    ctx = VerifyContext(runner=Runner(), host=HostRoot("/"), root="/", workdir=tmp_path)
    planned = plan_all(subjects(findings, [guest], []), ctx)
    assert planned
    for p in planned:
        p.result.error, p.result.notes = EVIL, [EVIL]
    ctx.notes.append(EVIL)
    text = render_text([p.result for p in planned], ctx, 1.0)
    assert_escaped(text)
    assert "measurement failed: db01\\x0aKVM-STO-004 db01 forged" in text


def test_prometheus_label_values_carry_no_control_characters() -> None:
    """`results show --format prometheus` and `sample` write label values from databases and domain names."""
    from kvmtune.prometheus import Metrics

    m = Metrics()
    m.add("kvmtune_x", "a gauge", {"domain": 'db01\x1b]0;owned\x07\n"\u202e'}, 1.0)
    text = m.text()
    assert not any(c in text for c in "\x1b\x07\u202e")
    assert len(text.splitlines()) == 3  # HELP, TYPE, one sample: no forged line
    assert 'domain="db01\\\\x1b]0;owned\\\\x07\\n\\"\\\\u202e"' in text
