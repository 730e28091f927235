"""verify --host --apply and a fix that takes effect at the host's next boot (issue 48, item 4): not measured
before a reboot, and the line says how to measure it after.

The real one: KVM-HST-047's ``iommu=pt``, which ``fix --host`` writes only into its GRUB drop-in (a kernel command
line: nothing to write now), on the pinned-latency tree made a GRUB host. The synthetic plan below (a drop-in for
KVM-HST-011 whose one item is ``host-boot``) keeps the check independent of that one rule.
"""

from __future__ import annotations

import shutil
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


def _debian_grub(tree: Path) -> None:
    """Make a tree a Debian GRUB host: /etc/default/grub, and a grub-mkconfig that sources /etc/default/grub.d."""
    (tree / "etc/default/grub").write_text('GRUB_CMDLINE_LINUX=""\n')
    (tree / "usr/sbin").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "tests" / "fixtures" / "grub" / "grub-mkconfig.debian", tree / "usr/sbin/grub-mkconfig")


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


def test_the_iommu_pt_fix_is_not_measured_before_a_reboot(tmp_path: Path) -> None:
    from kvmtune.cli import main

    tree = tmp_path / "tree"
    shutil.copytree(REPO / "tests" / "fixtures" / "hosts" / "pinned-latency", tree, symlinks=True)
    _debian_grub(tree)
    (finding,) = [f for f in run_rules(AuditContext(host=HostRoot(str(tree))), audit_host=True)
                  if f.rule == "KVM-HST-047"]
    assert finding.fix.kind == "cmdline"
    from kvmtune.fix.effect import for_finding

    assert for_finding(finding, None) == "host-boot"  # what audit says of it
    ctx = VerifyContext(runner=Runner(), host=HostRoot(str(tree)), root=str(tree), workdir=tmp_path, apply=True)
    with pytest.raises(Unmeasurable) as err:
        experiment.plan_host_finding(Subject(finding), ctx)
    text = str(err.value)
    assert "takes effect at the host's next boot (host-boot): not measured before a reboot" in text
    assert "'kvmtune fix --host --profile virtual-host --apply' and a reboot" in text
    assert text.endswith("measure it with: kvmtune verify --host --only KVM-HST-047")
    # the command itself, as an operator runs it: the line says so and nothing of the host changes
    before = sorted(p.relative_to(tree) for p in tree.rglob("*"))
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["verify", "--host", "--apply", "--yes", "--root", str(tree), "--only", "KVM-HST-047",
                     "--no-config", "--workdir", str(tmp_path / "work")])
    assert code == 0, out.getvalue()
    assert ("KVM-HST-047 iommu: not measured: its fix takes effect at the host's next boot (host-boot): not measured "
            "before a reboot") in out.getvalue(), out.getvalue()
    assert sorted(p.relative_to(tree) for p in tree.rglob("*")) == before


def test_the_iommu_pt_drop_in_is_staged_until_the_next_boot_and_undone(tmp_path: Path) -> None:
    """fix --host --apply writes only the GRUB drop-in for it (nothing to the running kernel); fix --status lists
    it until the host boots; undo removes it; without /etc/default/grub it is not planned, and the finding is
    manual."""
    import contextlib
    import io
    import json

    from kvmtune.cli import main

    def run(*argv: str) -> tuple[int, str]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main([*argv, "--no-config"])
        return code, out.getvalue()

    tree = tmp_path / "tree"
    shutil.copytree(REPO / "tests" / "fixtures" / "hosts" / "pinned-latency", tree, symlinks=True)
    code, out = run("fix", "--host", "--root", str(tree), "--format", "json")
    assert code == 0 and not [c for c in json.loads(out)["changes"] if c["rule"] == "KVM-HST-047"]
    assert "KVM-HST-047 iommu: iommu=pt belongs on the kernel command line, but this host has no /etc/default/grub" \
        in json.dumps(json.loads(out)["skipped"])
    # Red Hat's layout: /etc/default/grub, but grub2-mkconfig, which reads no grub.d: a drop-in would be ignored
    (tree / "etc/default/grub").write_text('GRUB_CMDLINE_LINUX=""\n')
    (tree / "usr/sbin").mkdir(parents=True, exist_ok=True)
    (tree / "usr/sbin/grub2-mkconfig").write_text("#! /bin/sh\n. /etc/default/grub\n")
    code, out = run("fix", "--host", "--root", str(tree), "--format", "json")
    assert code == 0 and not [c for c in json.loads(out)["changes"] if c["rule"] == "KVM-HST-047"]
    (finding,) = [f for f in run_rules(AuditContext(host=HostRoot(str(tree))), audit_host=True)
                  if f.rule == "KVM-HST-047"]
    assert finding.fix.kind == "manual"
    _debian_grub(tree)
    cmdline = (tree / "proc/cmdline").read_bytes()
    code, out = run("fix", "--host", "--root", str(tree), "--apply", "--yes")
    assert code == 0, out
    dropin = tree / "etc/default/grub.d/90-kvmtune.cfg"
    assert dropin.read_text().splitlines()[-1] == 'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX iommu=pt"'
    assert (tree / "proc/cmdline").read_bytes() == cmdline  # nothing written to the running kernel
    assert (tree / "etc/default/grub").read_text() == 'GRUB_CMDLINE_LINUX=""\n'
    code, out = run("fix", "--status", "--root", str(tree))
    assert "create /etc/default/grub.d/90-kvmtune.cfg: staged (host-boot): read at the host's next boot" in out, out
    code, out = run("fix", "--host", "--root", str(tree))  # applying again plans nothing new for it
    assert "90-kvmtune.cfg" not in out
    (journal,) = (tree / "var/lib/kvmtune/journal").glob("*.json")
    code, out = run("undo", "--root", str(tree), journal.stem, "--yes")
    assert code == 0 and not dropin.exists() and not (tree / "etc/default/grub.d").exists(), out


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
