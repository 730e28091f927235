"""The remedy contract, over every rule: a rule declares its remedy (``fix_kind``); declared
fixable means the fixer exists, and on a fixture the finding is gone after the fix.

* guest definition (``xml``): a registered fixer; on a bad fixture of the rule
  (``tests/rules/<ID>/bad``) or a golden input (``tests/fix/golden/<ID>``) the finding
  is gone after ``fix_guest`` (with ``--allow-bus-change``).
* host (``sysctl``/``sysfs``/``udev``/``modprobe``/``cmdline``): a setting of the host settings table
  answers it; ``fix --host --profile P --apply`` on a copy of every fixture tree under
  ``tests/fixtures/hosts`` leaves no finding a setting of P answers (a kernel command-line one after the
  tree's next "boot": its /proc/cmdline given the arguments of kvmtune's GRUB drop-in), and plain ``fix --host``
  leaves no host-fixable finding at all. Each host-fixable rule fires on some tree first.
* image (``image``): ``fix --images --apply`` on a real image with the problem removes it.
* ``manual``: the fix description says what to do, and no fixer claims the rule.
"""

from __future__ import annotations

import io
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from fixhelpers import FIXTURE_HOST, GOLDEN

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.audit.finding import Finding
from kvmtune.audit.rule import GuestRule, HostRule, Rule, all_rules, rule_by_id
from kvmtune.cli import main
from kvmtune.domain.xml import guest_from_tree, load_guest_file, parse_xml_bytes
from kvmtune.fix.domains import fix_guest
from kvmtune.fix.registry import FixOptions
from kvmtune.fix.remedies import Remedy, carried_out, declared
from kvmtune.host.root import HostRoot
from kvmtune.host.settings import PROFILES, answers
from kvmtune.qemu.image import read_image
from kvmtune.runner import Runner

REPO = Path(__file__).resolve().parents[2]
RULE_FIXTURES = REPO / "tests" / "rules"
RULES_HOST = REPO / "tests" / "fixtures" / "hosts" / "rules-default"
HOST_TREES = sorted(p for p in (REPO / "tests" / "fixtures" / "hosts").iterdir() if p.is_dir())
# states no captured tree is in, as edits of one (host path -> new content)
VARIANTS = {
    "ksm-overcommit+ksm-off": ("ksm-overcommit", {"/sys/kernel/mm/ksm/run": "0\n"}),  # KVM-HST-006
    # KVM-HST-047: pinned-latency (a guest with a device passed through, its IOMMU translating every device) as a
    # Debian GRUB host, where kvmtune's drop-in can carry iommu=pt (elsewhere the finding is manual)
    "pinned-latency+grub": ("pinned-latency", {
        "/etc/default/grub": 'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX=""\n',
        "/usr/sbin/grub-mkconfig": (REPO / "tests" / "fixtures" / "grub" / "grub-mkconfig.debian").read_text(),
    }),
}
TREES = [(p.name, p, {}) for p in HOST_TREES] + [
    (name, HOST_TREES[0].parent / base, edits) for name, (base, edits) in VARIANTS.items()
]
HOST_RULES = [r for r in all_rules() if issubclass(r, HostRule)]


def _ids(r: type[Rule]) -> str:
    return r.id


@pytest.mark.parametrize("rule", all_rules(), ids=_ids)
def test_declared_remedy_is_the_one_carried_out(rule: type[Rule]) -> None:
    remedy = declared(rule.fix_kind)
    assert remedy is not None, f"{rule.id}: unknown fix_kind {rule.fix_kind!r}"
    done = carried_out(rule)
    if remedy is Remedy.MANUAL:
        assert done == set(), f"{rule.id} says manual but {done} fixes it: declare that kind"
        assert len(rule.fix_description) > 20, f"{rule.id}: a manual fix says what to do"
    else:
        assert done == {remedy}, f"{rule.id} declares {remedy.name} but is fixed by {done or 'nothing'}"


# --------------------------------------------------------------------------- guest definitions

XML_RULES = [r for r in all_rules() if declared(r.fix_kind) is Remedy.GUEST_XML]


def _xml_cases(rule_id: str) -> list[Path]:
    return sorted((RULE_FIXTURES / rule_id / "bad").glob("*.xml")) + sorted((GOLDEN / rule_id).glob("*.in.xml"))


def _guest_findings(data: bytes, where: str, rule: type[Rule], host: Path) -> list[Finding]:
    guest = guest_from_tree(parse_xml_bytes(data, where), where)
    guest.on_audited_host = True  # as kvmtune fix sees the definitions it fixes
    return run_rules(AuditContext(host=HostRoot(str(host))), [guest], rules=[rule])


@pytest.mark.parametrize("rule", XML_RULES, ids=_ids)
def test_guest_fix_removes_the_finding(rule: type[Rule]) -> None:
    assert issubclass(rule, GuestRule), f"{rule.id}: only guest rules are fixed from a guest's definition"
    fixed = 0
    tried: list[str] = []
    for case in _xml_cases(rule.id):
        for host in (RULES_HOST, FIXTURE_HOST):
            data = case.read_bytes()
            if not _guest_findings(data, str(case), rule, host):
                continue
            options = FixOptions(allow_bus_change=True, allow_cpu_change=True, assume_this_host=True, host=HostRoot(str(host)))
            _guest, result = fix_guest(data, str(case), "xml", [rule], options)
            tried.append(f"{case.name}: {result.skipped}")
            if result.after is not None:
                assert _guest_findings(result.after, str(case), rule, host) == [], case
                fixed += 1
    assert fixed, f"{rule.id}: no fixture where its finding is fixed ({tried or 'it fires on none'})"


# --------------------------------------------------------------------------- host settings


def _copy(tree: tuple[str, Path, dict[str, str]], into: Path) -> Path:
    name, src, edits = tree
    root = into / name
    shutil.copytree(src, root, symlinks=True)
    for host_path, text in edits.items():
        (root / host_path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / host_path.lstrip("/")).write_text(text)
    return root


def _boot(tree: Path) -> None:
    """The host's next boot, as far as a tree can have one: the kernel command line gets what kvmtune's GRUB drop-in
    adds (update-grub and a reboot would put it there)."""
    dropin = tree / "etc/default/grub.d/90-kvmtune.cfg"
    if not dropin.exists():
        return
    (line,) = [x for x in dropin.read_text().splitlines() if x.startswith("GRUB_CMDLINE_LINUX=")]
    args = line.split("$GRUB_CMDLINE_LINUX", 1)[1].rstrip('"').split()
    cmdline = tree / "proc/cmdline"
    cmdline.write_text(" ".join([*cmdline.read_text().split(), *args]) + "\n")


@pytest.fixture(scope="module")
def fired_before(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    into = tmp_path_factory.mktemp("trees")
    return {
        f.rule for tree in TREES
        for f in run_rules(AuditContext(host=HostRoot(str(_copy(tree, into)))), audit_host=True, rules=HOST_RULES)
    }


@pytest.mark.parametrize("rule", [r for r in HOST_RULES if declared(r.fix_kind) is Remedy.HOST], ids=_ids)
def test_host_fixable_rule_fires_on_a_fixture_tree(rule: type[Rule], fired_before: set[str]) -> None:
    assert rule.id in fired_before, f"{rule.id}: no tree in tests/fixtures/hosts (or VARIANTS) to check its fix on"


@pytest.fixture
def tree_copy(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    yield _copy(request.param, tmp_path)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("tree_copy", TREES, ids=lambda t: t[0], indirect=True)
def test_fix_host_leaves_no_finding_it_answers(tree_copy: Path, profile: str) -> None:
    with redirect_stdout(io.StringIO()):
        assert main(["fix", "--host", "--profile", profile, "--apply", "--yes", "--root", str(tree_copy)]) == 0
    # a kernel command-line fix (cmdline) is in force only after the next boot: before it, its finding stays
    before = run_rules(AuditContext(host=HostRoot(str(tree_copy))), audit_host=True, rules=HOST_RULES)
    assert {f.rule for f in before if f.fix.kind == "cmdline"} <= {"KVM-HST-047"}
    _boot(tree_copy)
    ctx = AuditContext(host=HostRoot(str(tree_copy)))
    left = [f for f in run_rules(ctx, audit_host=True, rules=HOST_RULES) if declared(f.fix.kind) is Remedy.HOST]
    assert [(f.rule, f.target.device) for f in left if answers(f.rule, f.target.device, profile)] == []
    if profile == "virtual-host":  # what plain `kvmtune fix --host` applies
        assert [(f.rule, f.target.device) for f in left] == []


# --------------------------------------------------------------------------- images

IMAGE_PROBLEMS = {
    "KVM-IMG-002": ("qcow2", ["-o", "preallocation=off"]),
    "KVM-IMG-003": ("raw", []),
}


def test_every_image_fixable_rule_has_a_fixture() -> None:
    image_rules = {r.id for r in all_rules() if declared(r.fix_kind) is Remedy.IMAGE}
    assert image_rules == set(IMAGE_PROBLEMS)


@pytest.mark.skipif(shutil.which("qemu-img") is None, reason="qemu-img not installed")
@pytest.mark.parametrize("rule_id", sorted(IMAGE_PROBLEMS))
def test_image_fix_removes_the_finding(rule_id: str, tmp_path: Path) -> None:
    fmt, opts = IMAGE_PROBLEMS[rule_id]
    path = tmp_path / f"disk.{fmt}"
    subprocess.run(["qemu-img", "create", "-q", "-f", fmt, *opts, str(path), "64M"], check=True)
    rule = rule_by_id(rule_id)
    assert rule is not None

    def found() -> list[str]:
        img = read_image(str(path), Runner(), [])
        return [f.rule for f in run_rules(AuditContext(), images=[img], rules=[rule])]

    assert found() == [rule_id]
    with redirect_stdout(io.StringIO()):
        assert main(["fix", "--images", str(path), "--image-format", fmt, "--apply", "--yes"]) == 0
    assert found() == []


def test_load_guest_file_is_what_fixtures_use() -> None:
    # the guest fixtures above are read as `kvmtune audit FILE` reads them
    case = _xml_cases("KVM-STO-002")[0]
    assert load_guest_file(case).name


def test_vcpu_fix_leaves_a_topology_alone_and_says_why() -> None:
    case = Path(__file__).parent / "cases" / "vcpus-with-topology.xml"
    rule = rule_by_id("KVM-CPU-002")
    assert rule is not None
    assert [f.rule for f in _guest_findings(case.read_bytes(), str(case), rule, FIXTURE_HOST)] == ["KVM-CPU-002"]
    options = FixOptions(allow_bus_change=True, allow_cpu_change=True, assume_this_host=True, host=HostRoot(str(FIXTURE_HOST)))
    _guest, result = fix_guest(case.read_bytes(), str(case), "xml", [rule], options)
    assert result.after is None
    assert result.skipped == [
        "build02: KVM-CPU-002 vcpus: not fixed automatically: <cpu><topology>/<numa> must change with it; "
        "choose sockets/cores/threads by hand"
    ]
