"""Which part of ``kvmtune fix`` carries out the remedy a rule declares.

A rule declares its remedy with ``fix_kind``: ``xml`` (a fixer edits the guest's
definition, :mod:`kvmtune.fix.fixers`), a host kind (``sysctl``, ``sysfs``,
``udev``, ``modprobe``, ``cmdline``: a setting of :mod:`kvmtune.host.settings` that
``fix --host`` writes), ``image`` (``fix --images`` converts the image,
:mod:`kvmtune.fix.images`) or ``manual`` (nothing automatic; the fix description
says what to do and why kvmtune does not). A finding may narrow its rule's
declaration to ``manual`` for a case no fixer answers.

``tests/fix/test_remedies.py`` holds every rule to its declaration: declared
fixable means the fixer exists and, on a fixture, the finding is gone after the fix.
"""

from __future__ import annotations

from enum import Enum

from kvmtune.audit.rule import Rule
from kvmtune.fix.images import ANSWERS as IMAGE_ANSWERS
from kvmtune.fix.registry import all_fixers
from kvmtune.host.settings import host_fixed_rules

HOST_KINDS = ("sysctl", "sysfs", "udev", "modprobe", "cmdline")


class Remedy(Enum):
    GUEST_XML = "guest definition (kvmtune fix DOMAIN.xml / --connect)"
    HOST = "host settings (kvmtune fix --host)"
    IMAGE = "image conversion (kvmtune fix --images)"
    MANUAL = "manual"


def declared(kind: str) -> Remedy | None:
    """The remedy a fix kind declares (``None``: not a kind kvmtune knows)."""
    if kind == "xml":
        return Remedy.GUEST_XML
    if kind in HOST_KINDS:
        return Remedy.HOST
    if kind == "image":
        return Remedy.IMAGE
    if kind == "manual":
        return Remedy.MANUAL
    return None


def carried_out(rule: type[Rule]) -> set[Remedy]:
    """The parts of ``kvmtune fix`` that answer this rule's findings."""
    out: set[Remedy] = set()
    if rule.id in all_fixers():
        out.add(Remedy.GUEST_XML)
    if rule.id in host_fixed_rules():
        out.add(Remedy.HOST)
    if rule.id in IMAGE_ANSWERS:
        out.add(Remedy.IMAGE)
    return out
