"""One guard around every rule call: a rule that raises is one error line; the audit goes on.

The guard lives in the engine, not in each scope's base class, so a guest rule is
as safe as a host rule. The failing rules here are real subclasses of the four
scopes, run by the real engine over real inputs (the bundled example domains, the
rhel6-old host fixture, a qcow2 image made with qemu-img).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvmtune.audit.collect import EXAMPLES
from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.audit.finding import Finding
from kvmtune.audit.rule import GuestRule, HostRule, ImageRule, RunRule, rule_by_id
from kvmtune.domain.xml import load_guest_file
from kvmtune.host.root import HostRoot
from kvmtune.model.guest import Guest
from kvmtune.qemu.image import DiskImage, read_image
from kvmtune.runner import Runner

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"


class Broken(Exception):
    pass


class GuestBoom(GuestRule):
    id = "TEST-GST-001"

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        raise Broken(f"guest {guest.name}")
        yield  # a generator, like the real rules


class RunBoom(RunRule):
    id = "TEST-RUN-001"

    def check_run(self, guests: list[Guest], ctx: AuditContext) -> list[Finding]:
        raise Broken(f"{len(guests)} guests")  # not a generator: raises at the call itself


class HostBoom(HostRule):
    id = "TEST-HST-001"

    def check_host(self, ctx: AuditContext) -> Iterator[Finding]:
        raise Broken("host")
        yield


class ImageBoom(ImageRule):
    id = "TEST-IMG-001"

    def check_image(self, image: DiskImage, ctx: AuditContext) -> Iterator[Finding]:
        raise Broken(image.path)
        yield


@pytest.fixture
def image(tmp_path: Path) -> DiskImage:
    if shutil.which("qemu-img") is None:
        pytest.skip("qemu-img not installed")
    path = tmp_path / "disk.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(path), "64M"], check=True)
    return read_image(str(path), Runner(), [])


def test_a_raising_rule_of_every_scope_costs_one_line_each_and_the_rest_runs(image: DiskImage) -> None:
    guests = [load_guest_file(p) for p in sorted(EXAMPLES.glob("*.xml"))]
    real = [rule_by_id(r) for r in ("KVM-NET-001", "KVM-HST-010", "KVM-IMG-004")]
    assert None not in real
    ctx = AuditContext(host=HostRoot(str(HOSTS / "rhel6-old")), runner=Runner())
    rules = [GuestBoom, RunBoom, HostBoom, ImageBoom, *(r for r in real if r is not None)]

    findings = run_rules(ctx, guests, [image], audit_host=True, rules=rules)

    assert ctx.errors == [
        *(f"TEST-GST-001: could not be evaluated for guest {g.name} (Broken: guest {g.name})" for g in guests),
        f"TEST-RUN-001: could not be evaluated (Broken: {len(guests)} guests)",
        "TEST-HST-001: could not be evaluated (Broken: host)",
        f"TEST-IMG-001: could not be evaluated for {image.path} (Broken: {image.path})",
    ]
    # the real rules after the broken ones still ran: web01-legacy's rtl8139 and rhel6-old's swappiness 60
    assert {"KVM-NET-001", "KVM-HST-010"} <= {f.rule for f in findings}


def test_findings_yielded_before_the_raise_are_kept() -> None:
    class HalfWay(HostRule):
        id = "TEST-HST-002"

        def check_host(self, ctx: AuditContext) -> Iterator[Finding]:
            yield self.finding(target=ctx.host_target("x"), actual="a", expected="b", evidence="c")
            raise Broken("after one")

    ctx = AuditContext(host=HostRoot(str(HOSTS / "rhel6-old")))
    found = run_rules(ctx, audit_host=True, rules=[HalfWay])
    assert [f.rule for f in found] == ["TEST-HST-002"]
    assert ctx.errors == ["TEST-HST-002: could not be evaluated (Broken: after one)"]


def test_a_guest_rule_that_raises_halfway_keeps_what_it_yielded_and_goes_on_to_the_next_guests() -> None:
    guests = [load_guest_file(p) for p in sorted(EXAMPLES.glob("*.xml"))]
    assert len(guests) >= 3
    failing = guests[1].name

    class HalfWayGuest(GuestRule):
        id = "TEST-GST-002"

        def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
            yield self.finding(target=self.target(guest), actual="a", expected="b", evidence="c")
            if guest.name == failing:
                raise Broken(f"after one for {guest.name}")
            yield self.finding(target=self.target(guest, "second"), actual="a", expected="b", evidence="c")

    ctx = AuditContext(host=HostRoot(str(HOSTS / "rules-default")))
    found = run_rules(ctx, guests, rules=[HalfWayGuest])
    per_guest = {g.name: sum(f.target.domain == g.name for f in found) for g in guests}
    assert per_guest == {g.name: 1 if g.name == failing else 2 for g in guests}
    assert ctx.errors == [f"TEST-GST-002: could not be evaluated for guest {failing} (Broken: after one for {failing})"]


def test_a_rule_that_raises_while_fixing_is_said_in_the_plan() -> None:
    from kvmtune.fix.domains import fix_guest
    from kvmtune.fix.registry import FixOptions

    case = EXAMPLES / "web01-legacy.xml"
    rule = rule_by_id("KVM-STO-002")
    assert rule is not None
    options = FixOptions(host=HostRoot(str(HOSTS / "rules-default")))
    _guest, result = fix_guest(case.read_bytes(), str(case), "xml", [GuestBoom, rule], options)
    assert result.after is not None  # the working rule's fix still goes ahead
    assert result.skipped == [
        "web01-legacy: TEST-GST-001: could not be evaluated for guest web01-legacy (Broken: guest web01-legacy)"
    ]
