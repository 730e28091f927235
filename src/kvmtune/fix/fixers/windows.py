"""Fixes for the Windows guest rules (KVM-WIN-*): enlightenments and clock timers."""

from __future__ import annotations

from lxml import etree

from kvmtune.domain.windows import SPINLOCK_RETRIES, WANTED_HYPERV
from kvmtune.fix.fixers._util import insert_top_level, new
from kvmtune.fix.registry import FixCall, NotFixable, xml_fixer


def _clock(call: FixCall) -> etree._Element:
    clock = call.child(call.root, "clock")
    if clock is None:
        clock = insert_top_level(call, new("clock", offset="localtime"), ("features", "cpu"))
    return clock


def _timer(call: FixCall, name: str, **attrs: str) -> str:
    clock = _clock(call)
    for el in clock:
        if el.tag == "timer" and el.get("name") == name:
            before = {k: el.get(k) for k in attrs}
            for k, v in attrs.items():
                if el.get(k) != v:
                    call.doc.set_attr(el, k, v)
            return ", ".join(f"{name} {k} {before[k] or 'unset'} → {v}" for k, v in attrs.items() if before[k] != v)
    call.doc.append(clock, new("timer", name=name, **attrs))
    return f"add <timer name='{name}' " + " ".join(f"{k}='{v}'" for k, v in attrs.items()) + "/>"


@xml_fixer("KVM-WIN-001", "Hyper-V enlightenments on for a Windows guest")
def hyperv_on(call: FixCall) -> str:
    features = call.child(call.root, "features")
    if features is None:
        features = insert_top_level(call, new("features"), ("os",))
    hv = call.child(features, "hyperv")
    if hv is None:
        hv = call.doc.append(features, new("hyperv", mode="custom"))
    elif hv.get("mode") in ("passthrough", "host-model"):
        raise NotFixable(f"<hyperv mode='{hv.get('mode')}'> already passes the host's enlightenments")
    changed = []
    for name in WANTED_HYPERV:
        el = call.child(hv, name)
        extra = {"retries": SPINLOCK_RETRIES} if name == "spinlocks" else {}
        if el is None:
            call.doc.append(hv, new(name, state="on", **extra))
            changed.append(name)
        elif el.get("state") != "on":
            call.doc.set_attr(el, "state", "on")
            for k, v in extra.items():
                if not el.get(k):
                    call.doc.set_attr(el, k, v)
            changed.append(name)
    if not changed:
        raise NotFixable("every enlightenment is on already")
    return f"Hyper-V enlightenments on: {', '.join(changed)}"


@xml_fixer("KVM-WIN-002", "hypervclock timer for a Windows guest")
def hypervclock_on(call: FixCall) -> str:
    return _timer(call, "hypervclock", present="yes") or "hypervclock present already"


@xml_fixer("KVM-WIN-003", "HPET off for a Windows guest")
def hpet_off(call: FixCall) -> str:
    return _timer(call, "hpet", present="no") or "hpet off already"


@xml_fixer("KVM-WIN-004", "RTC tickpolicy='catchup' for a Windows guest")
def rtc_catchup(call: FixCall) -> str:
    return _timer(call, "rtc", tickpolicy="catchup") or "rtc catchup already"
