"""Issue 37, item 4: verify's guest-tier verdicts feed the seed claims in ``kvmtune report``: seed 000's
"virtio-blk vs IDE" (the bus fix), seed 002's vhost-net and the multiqueue claim, each line naming the tier
and the accelerator; under TCG "not comparable", never holds or does not hold.

The run is stored for real (a Store in tmp_path, written by the shared BenchRunner, cells from
``verify.engine.to_cell``), and the report is the CLI's, run as a subprocess."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest

from cli_child import kvmtune
from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules, select_rules
from kvmtune.audit.finding import Finding
from kvmtune.domain.xml import guest_from_tree, parse_xml_bytes
from kvmtune.host.root import HostRoot
from kvmtune.lab.runner import BenchRunner, Cell, CellSink, HostBenchLock
from kvmtune.lab.store import Store
from kvmtune.lab.vocabulary import DOES_NOT_HOLD, HELPS, HOLDS, HURTS, NOT_COMPARABLE
from kvmtune.verify.engine import VerifyResult, to_cell
from kvmtune.verify.measure import Judgement, Metric

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "src" / "kvmtune" / "examples"
IOPS = Metric("iops", "IOPS", True)
MBPS = Metric("throughput_MBps", "MB/s", True)
# one NIC with vhost-net switched off (KVM-NET-002), one single-queue vhost NIC on a 4-vCPU guest (KVM-NET-008)
NET_XML = """<domain type='kvm'><name>netg</name><memory unit='MiB'>1024</memory><vcpu>4</vcpu>
<os><type arch='x86_64' machine='pc-q35-8.2'>hvm</type></os><devices>
<interface type='bridge'><mac address='52:54:00:00:00:01'/><source bridge='br0'/><model type='virtio'/>
<driver name='qemu'/></interface>
<interface type='bridge'><mac address='52:54:00:00:00:02'/><source bridge='br0'/><model type='virtio'/></interface>
</devices></domain>"""


def findings(xml: bytes, origin: str, rule: str) -> list[Finding]:
    guest = guest_from_tree(parse_xml_bytes(xml, origin), origin, "xml")
    found = run_rules(AuditContext(host=HostRoot("/")), [guest], [], False, select_rules([rule], []))
    assert found, f"{rule} finds nothing in {origin}"
    return found


def measured(f: Finding, accel: str, verdict: str, ratio: float, interval: tuple[float, float],
             metric: Metric = IOPS) -> VerifyResult:
    """A guest-tier result as the experiments leave it (under TCG the verdict is not comparable)."""
    j = Judgement(metric, 100.0, 100.0 * ratio, ratio, interval, NOT_COMPARABLE if accel == "tcg" else verdict, 4)
    r = VerifyResult(f, tier="guest", change="the fix", workload="fio randwrite 4k QD16", judgement=j,
                     verdict=j.verdict, action="nothing changed (probe guests)", accel=accel)
    if accel == "tcg":
        r.details["verdict_under_emulation"] = verdict
    return r


class Stored:
    """A verify run's cells, recorded through the shared runner as VerifyBenchmark records them."""

    kind = "verify"

    def __init__(self, cells: list[Cell]) -> None:
        self.cells = cells

    def plan(self) -> str:
        return f"verify: {len(self.cells)} experiment(s)"

    def planned_cells(self) -> int:
        return len(self.cells)

    def environment(self) -> dict[str, Any]:
        return {}

    def execute(self, sink: CellSink) -> None:
        for c in self.cells:
            sink.record(c)

    def describe(self, cell: Cell) -> str:
        return str(cell.config.get("verdict"))

    def cleanup(self) -> list[str]:
        return []


def store_run(db: Path, results: list[VerifyResult], lock: Path) -> int:
    with Store(db) as st:
        out = BenchRunner(st, stream=io.StringIO(), lock=HostBenchLock(lock)).run(Stored([to_cell(r) for r in results]))
    return out.run_id


def the_results(accel: str, verdicts: tuple[str, str, str]) -> list[VerifyResult]:
    (ide,) = findings((EXAMPLES / "web01-legacy.xml").read_bytes(), str(EXAMPLES / "web01-legacy.xml"), "KVM-STO-001")
    (vhost,) = findings(NET_XML.encode(), "netg.xml", "KVM-NET-002")
    (mq,) = findings(NET_XML.encode(), "netg.xml", "KVM-NET-008")
    bus, vh, q = verdicts
    return [measured(ide, accel, bus, 4.0, (3.2, 5.0)),
            measured(vhost, accel, vh, 2.5 if vh == HELPS else 1.0, (2.1, 3.0) if vh == HELPS else (0.98, 1.02), MBPS),
            measured(mq, accel, q, 0.6 if q == HURTS else 1.6, (0.5, 0.7) if q == HURTS else (1.4, 1.8), MBPS)]


def seed_lines(text: str) -> dict[str, str]:
    """The report's seed lines from verify cells, by claim (the rest of the report left out)."""
    out = {}
    for line in text.splitlines():
        if "[verify run" not in line:
            continue
        key = "ide" if "seed:000" in line else "vhost" if "vhost-net" in line else "mq" if "multiqueue" in line else "?"
        assert key not in out, f"two lines for {key}: {text}"
        out[key] = line
    return out


def test_tcg_guest_tier_fixes_make_the_seed_claims_not_comparable(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    run = store_run(db, the_results("tcg", (HELPS, HELPS, HELPS)), tmp_path / "lock")
    out = kvmtune("report", str(run), "--db", str(db), "--html", str(tmp_path / "r.html"), home=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = seed_lines(out.stdout)
    assert set(lines) == {"ide", "vhost", "mq"}, out.stdout
    for key, line in lines.items():
        assert f"[verify run {run}, guest tier, accelerator tcg]" in line, line
        assert NOT_COMPARABLE in line and "measured in a TCG guest, the seed measured KVM guests" in line, line
        assert not re.search(rf"(?<![\w-])({HOLDS}|{DOES_NOT_HOLD})\b", line), f"{key}: a TCG line settled: {line}"
    assert "KVM-STO-001" in lines["ide"] and "seed:000" in lines["ide"]
    assert "KVM-NET-002" in lines["vhost"] and lines["vhost"].startswith("  run 1: seed:002")
    assert "KVM-NET-008" in lines["mq"]
    html = (tmp_path / "r.html").read_text()
    rows = re.findall(r"<tr><td>(seed:\d+|published figures)</td>.*?</tr>", html)
    verify_rows = [r for r in re.findall(r"<tr>.*?</tr>", html) if "verify: guest tier, accelerator tcg" in r]
    assert len(verify_rows) == 3 and rows, html[:2000]
    for row in verify_rows:
        assert re.search(r"class='badge'[^>]*>not comparable</span>", row), row


def test_kvm_guest_tier_fixes_settle_the_seed_claims(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    run = store_run(db, the_results("kvm", (HELPS, "no measurable effect", HURTS)), tmp_path / "lock")
    out = kvmtune("report", str(run), "--db", str(db), "--html", str(tmp_path / "r.html"), home=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = seed_lines(out.stdout)
    assert set(lines) == {"ide", "vhost", "mq"}, out.stdout
    for line in lines.values():
        assert f"[verify run {run}, guest tier, accelerator kvm]" in line and NOT_COMPARABLE not in line, line
    # 4.0× with 95 % interval 3.2-5.0 lies wholly inside "about 4.5×" (half to twice it)
    ide = lines["ide"]
    assert "4.00× (95% interval 3.20–5.00×, 4 rounds a side) the iops" in ide and "'about 4.5×': holds" in ide, ide
    assert f"seed:002: {DOES_NOT_HOLD}:" in lines["vhost"], lines["vhost"]  # no measurable effect: not "beats"
    assert f": {DOES_NOT_HOLD}:" in lines["mq"] and "-40 %" in lines["mq"], lines["mq"]
    html = (tmp_path / "r.html").read_text()
    badges = [re.search(r"class='badge'[^>]*>([^<]+)</span>", r).group(1)  # type: ignore[union-attr]
              for r in re.findall(r"<tr>.*?</tr>", html) if "verify: guest tier, accelerator kvm" in r]
    assert sorted(badges) == sorted([HOLDS, DOES_NOT_HOLD, DOES_NOT_HOLD]), badges


@pytest.mark.parametrize(("ratio", "interval", "word"), [(4.0, (3.2, 5.0), HOLDS), (1.3, (1.1, 1.5), DOES_NOT_HOLD),
                                                          (2.6, (1.5, 4.4), "inconclusive")])
def test_the_bus_fix_is_judged_against_about_4_5x(tmp_path: Path, ratio: float, interval: tuple[float, float],
                                                  word: str) -> None:
    (ide,) = findings((EXAMPLES / "web01-legacy.xml").read_bytes(), str(EXAMPLES / "web01-legacy.xml"), "KVM-STO-001")
    db = tmp_path / "results.db"
    run = store_run(db, [measured(ide, "kvm", HELPS, ratio, interval)], tmp_path / "lock")
    from kvmtune.bench.net.claims import verified_claims

    with Store(db) as st:
        ((where, claim),) = verified_claims(st.cells(run))
    assert where == "guest tier, accelerator kvm" and claim.seed == "seed:000"
    assert claim.word() == word  # type: ignore[union-attr]


def test_other_verified_fixes_answer_no_seed_claim(tmp_path: Path) -> None:
    """A block-tier cache fix, and a bus fix stored without a slug (before verify kept it), make no seed line."""
    (cache,) = findings((EXAMPLES / "web01-legacy.xml").read_bytes(), str(EXAMPLES / "web01-legacy.xml"), "KVM-STO-002")
    r = measured(cache, "kvm", HELPS, 4.0, (3.2, 5.0))
    r.tier, r.accel = "block", None
    (ide,) = findings((EXAMPLES / "web01-legacy.xml").read_bytes(), str(EXAMPLES / "web01-legacy.xml"), "KVM-STO-001")
    old = to_cell(measured(ide, "kvm", HELPS, 4.0, (3.2, 5.0)))
    del old.config["slug"]
    db = tmp_path / "results.db"
    with Store(db) as st:
        run = BenchRunner(st, stream=io.StringIO(), lock=HostBenchLock(tmp_path / "lock")).run(
            Stored([to_cell(r), old])).run_id
        from kvmtune.bench.net.claims import verified_claims

        assert verified_claims(st.cells(run)) == []
