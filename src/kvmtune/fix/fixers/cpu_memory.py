"""Fixes for the CPU and memory rules (KVM-CPU-*, KVM-MEM-*)."""

from __future__ import annotations

from kvmtune.fix.fixers._util import insert_top_level, new
from kvmtune.fix.registry import FixCall, NotFixable, xml_fixer


@xml_fixer("KVM-MEM-001", "<memoryBacking><nosharepages/> for a pinned or NUMA-placed guest")
def nosharepages(call: FixCall) -> str:
    backing = call.child(call.root, "memoryBacking")
    if backing is None:
        mb = new("memoryBacking")
        mb.append(new("nosharepages"))
        insert_top_level(call, mb, ("memory", "currentMemory", "maxMemory"))
        return "add <memoryBacking><nosharepages/>; KSM no longer merges this guest's memory"
    if call.child(backing, "nosharepages") is not None:
        raise NotFixable("<nosharepages/> is there already")
    call.doc.append(backing, new("nosharepages"))
    return "add <nosharepages/> to <memoryBacking>; KSM no longer merges this guest's memory"


@xml_fixer("KVM-MEM-002", "memballoon model='virtio' with statistics")
def balloon(call: FixCall) -> str:
    devices = call.devices()
    el = call.child(devices, "memballoon")
    if el is None:
        raise NotFixable("no <memballoon> element to change")
    call.doc.set_attr(el, "model", "virtio")
    if call.child(el, "stats") is None:
        call.doc.append(el, new("stats", period="10"))
    return "memballoon model none → virtio, stats every 10 s"
