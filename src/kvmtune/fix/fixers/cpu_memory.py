"""Fixes for the CPU and memory rules (KVM-CPU-*, KVM-MEM-*)."""

from __future__ import annotations

from kvmtune.fix.fixers._util import insert_top_level, new
from kvmtune.fix.live import MEMORY_STATS_PERIOD
from kvmtune.fix.registry import FixCall, NotFixable, xml_fixer
from kvmtune.host.facts import HostFacts


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


@xml_fixer("KVM-CPU-001", "cpu mode='host-model' instead of a generic CPU model", cpu_change=True)
def cpu_host_model(call: FixCall) -> str:
    cpu = call.child(call.root, "cpu")
    if cpu is None:
        insert_top_level(call, new("cpu", mode="host-model"), ("features", "os"))
        return "add <cpu mode='host-model'/>; the guest sees the host's CPU features (AVX, AES-NI, …)"
    old = cpu.get("mode") or "custom"
    model = call.child(cpu, "model")
    was = (model.text or "").strip() if model is not None else ""
    call.doc.set_attr(cpu, "mode", "host-model")
    if cpu.get("match") is not None:
        call.doc.del_attr(cpu, "match")
    for tag in ("model", "vendor"):
        child = call.child(cpu, tag)
        if child is not None:
            call.doc.remove(child)
    return (
        f"cpu mode {old}{' ' + was if was else ''} → host-model; the guest sees the host's CPU features, "
        "migration needs a compatible destination"
    )


@xml_fixer("KVM-CPU-003", "domain type='kvm' instead of TCG emulation", cpu_change=True)
def kvm_accel(call: FixCall) -> str:
    if not call.options.host.exists("/dev/kvm"):
        raise NotFixable("this host has no /dev/kvm; enable virtualization in the firmware and load kvm first")
    call.doc.set_attr(call.root, "type", "kvm")
    return "domain type qemu → kvm (hardware virtualization; /dev/kvm is there)"


@xml_fixer("KVM-CPU-002", "<vcpu> lowered to the host's online CPUs", cpu_change=True)
def vcpus_to_host(call: FixCall) -> str:
    host_cpus = HostFacts(call.options.host).cpu_count
    if not host_cpus:
        raise NotFixable("the host's CPU count could not be read")
    vcpu = call.child(call.root, "vcpu")
    if vcpu is None or not (vcpu.text or "").strip().isdigit():
        raise NotFixable("no <vcpu> count in the definition")
    # these name vCPUs by number or must multiply up to the count: lowering it alone breaks the definition
    cpu = call.child(call.root, "cpu")
    if cpu is not None and (call.child(cpu, "topology") is not None or call.child(cpu, "numa") is not None):
        raise NotFixable("<cpu><topology>/<numa> must change with it; choose sockets/cores/threads by hand")
    if call.child(call.root, "vcpus") is not None:
        raise NotFixable("per-vCPU <vcpus> entries must change with it")
    tune = call.child(call.root, "cputune")
    if tune is not None and any(isinstance(c.tag, str) and c.get("vcpu") is not None for c in tune):
        raise NotFixable("<cputune> pins vCPUs by number; re-pin by hand")
    old = int((vcpu.text or "0").strip())
    call.doc.set_text(vcpu, str(host_cpus))
    current = vcpu.get("current")
    if current is not None and current.isdigit() and int(current) > host_cpus:
        call.doc.set_attr(vcpu, "current", str(host_cpus))
    return f"vcpu {old} → {host_cpus} (the host's online CPUs); the guest sees fewer CPUs after a restart"


@xml_fixer("KVM-CPU-025", "cpu migratable='off' for a host-passthrough guest that requires invtsc")
def invtsc_not_migratable(call: FixCall) -> str:
    cpu = call.child(call.root, "cpu")
    if cpu is None:
        raise NotFixable("no <cpu> element")
    if cpu.get("migratable") == "off":
        raise NotFixable("migratable='off' is there already")
    call.doc.set_attr(cpu, "migratable", "off")
    return "cpu migratable → off; the guest keeps invtsc and can no longer be live-migrated"


@xml_fixer("KVM-MEM-010", "memballoon freePageReporting='on'")
def balloon_free_page_reporting(call: FixCall) -> str:
    el = call.child(call.devices(), "memballoon")
    if el is None:
        raise NotFixable("no <memballoon> element")
    call.doc.set_attr(el, "freePageReporting", "on")
    return "memballoon freePageReporting → on; the guest hands freed pages back to the host"


# the balloon statistics period KVM-MEM-013 asks for (OpenStack nova's mem_stats_period_seconds)
PERIOD = 10


@xml_fixer("KVM-MEM-013", "memballoon <stats period='10'/>", live=MEMORY_STATS_PERIOD)
def balloon_stats_period(call: FixCall) -> str:
    el = call.child(call.devices(), "memballoon")
    if el is None:
        raise NotFixable("no <memballoon> element")
    stats = call.child(el, "stats")
    if stats is None:
        call.doc.append(el, new("stats", period=str(PERIOD)))
    else:
        call.doc.set_attr(stats, "period", str(PERIOD))
    return f"memballoon stats period → {PERIOD} s; the host sees the guest's memory use"
