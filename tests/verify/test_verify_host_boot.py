"""verify --host --apply and a fix that takes effect at the host's next boot (issue 48, item 4): not measured
before a reboot, and the line says how to measure it after.

kvmtune has no host fix today that is only a kernel command line or a module option (every host fix writes its
runtime value now, ``live``, and its drop-in repeats it at boot). The planner is therefore given such a plan here:
a drop-in for KVM-HST-011 whose one item is ``host-boot``, as a kernel command-line fix would plan it; the rest
is verify's real code path.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.fix.effect import Planned
from kvmtune.fix.files import FileState
from kvmtune.fix.plan import DropIn, Plan
from kvmtune.host.root import HostRoot
from kvmtune.runner import Runner
from kvmtune.verify.experiments import Subject, Unmeasurable, VerifyContext
from kvmtune.verify.host import experiment

REPO = Path(__file__).resolve().parents[2]


def _boot_only_plan(root: str, profile: str) -> Plan:
    path = Path(root) / "etc/default/grub.d/90-kvmtune.cfg"
    item = Planned("host", "KVM-HST-011", "/etc/default/grub.d/90-kvmtune.cfg", "kvm.halt_poll_ns=0 on the kernel "
                   "command line", "host-boot")
    return Plan(changes=[DropIn(path=path, shown="/etc/default/grub.d/90-kvmtune.cfg", before=FileState(None),
                                after=b"x\n", planned=[item])])


def test_a_host_boot_fix_is_not_measured_before_a_reboot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = REPO / "tests" / "fixtures" / "hosts" / "rules-default"
    finding = next(iter(run_rules(AuditContext(host=HostRoot(str(tree))), audit_host=True)))
    finding.rule = "KVM-HST-011"
    finding.evidence = "/proc/cmdline"  # no runtime write answers it
    monkeypatch.setattr(experiment, "plan_host", _boot_only_plan)
    ctx = VerifyContext(runner=Runner(), host=HostRoot(str(tree)), root=str(tree), workdir=tmp_path, apply=True)
    with pytest.raises(Unmeasurable) as err:
        experiment.plan_host_finding(Subject(finding), ctx)
    text = str(err.value)
    assert "takes effect at the host's next boot (host-boot): not measured before a reboot" in text
    assert text.endswith("measure it with: kvmtune verify --host --only KVM-HST-011")


def test_without_a_host_boot_change_the_old_reason_stands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = REPO / "tests" / "fixtures" / "hosts" / "rules-default"
    finding = next(iter(run_rules(AuditContext(host=HostRoot(str(tree))), audit_host=True)))
    finding.evidence = "/nowhere"
    monkeypatch.setattr(experiment, "plan_host", lambda root, profile: Plan())
    ctx = VerifyContext(runner=Runner(), host=HostRoot(str(tree)), root=str(tree), workdir=tmp_path, apply=True)
    with pytest.raises(Unmeasurable, match="writes no runtime value"):
        experiment.plan_host_finding(Subject(finding), ctx)


def test_a_guest_fix_line_says_a_running_guest_sees_it_only_after_its_restart() -> None:
    from kvmtune.domain.xml import load_guest_file
    from kvmtune.verify.engine import guest_sees_it

    guest = load_guest_file(str(REPO / "src" / "kvmtune" / "examples" / "web01-legacy.xml"))
    finding = next(f for f in run_rules(AuditContext(host=HostRoot(str(REPO / "tests" / "fix" / "hostroot"))), [guest])
                   if f.fix.kind == "xml")
    assert guest_sees_it(Subject(finding, guest)) == ""  # a file: no running guest
    guest.active = True
    assert guest_sees_it(Subject(finding, guest)).endswith("only after its restart (kvmtune fix: takes effect restart)")
