"""A guest's CPU placement as its domain XML states it: <vcpu cpuset>, <cputune> pins, <cpu> topology,
guest NUMA cells and features. Only guests read from XML have it (a QEMU command line does not carry
libvirt's pinning; the running threads' affinity is a host fact)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvmtune.domain.xml import memory_kib, top_elements
from kvmtune.host.parsers import parse_cpu_list
from kvmtune.model.guest import Guest
from kvmtune.model.values import unit_kib, xml_int


@dataclass(frozen=True)
class NumaCell:
    """One <cpu><numa><cell>: its id, its vCPUs and its memory (KiB; None when unreadable)."""

    id: int | None
    cpus: frozenset[int]
    memory_kib: int | None
    cpus_text: str | None = None  # cpus= as written (None: a memory-only cell)


@dataclass
class CpuLayout:
    vcpu_cpuset: set[int] = field(default_factory=set)  # <vcpu cpuset=…>: the default for unpinned vCPUs
    vcpupins: dict[int, set[int]] = field(default_factory=dict)  # vCPU → host CPUs
    emulatorpin: set[int] = field(default_factory=set)
    iothreadpins: dict[int, set[int]] = field(default_factory=dict)
    topology: dict[str, int] = field(default_factory=dict)  # sockets, dies, clusters, cores, threads
    numa_cells: int = 0  # <cpu><numa><cell> count
    cells: list[NumaCell] = field(default_factory=list)  # the cells themselves
    max_vcpus: int | None = None  # <vcpu>'s text: the vCPUs the guest can have (cells number 0 … max_vcpus-1)
    memory_stated_kib: int | None = None  # <memory> as written (libvirt sizes a NUMA guest by its cells)
    numatune_mode: str | None = None
    numatune_nodeset: set[int] | None = None
    migratable: str | None = None  # <cpu migratable='on|off'> (host-passthrough, maximum)
    features: dict[str, str] = field(default_factory=dict)  # feature name → policy

    @property
    def vcpu_cpus(self) -> set[int]:
        """Every host CPU some vCPU may run on (pins, else the <vcpu cpuset> default)."""
        out = set().union(*self.vcpupins.values()) if self.vcpupins else set()
        return out | (self.vcpu_cpuset if self.vcpu_cpuset and not self.vcpupins else set())

    @property
    def pinned(self) -> bool:
        return bool(self.vcpupins or self.vcpu_cpuset)


def _cpus(text: str | None) -> set[int]:
    """A libvirt cpuset (``0-3,^2,8``); exclusions honoured; garbage → empty (the XML is untrusted)."""
    if not text:
        return set()
    keep: set[int] = set()
    drop: set[int] = set()
    for part in text.replace(" ", "").split(","):
        target = drop if part.startswith("^") else keep
        try:
            target |= parse_cpu_list(part.lstrip("^"))
        except ValueError:
            return set()
    return keep - drop


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def cpu_layout(guest: Guest) -> CpuLayout | None:
    """The layout of a guest read from domain XML; ``None`` for command-line guests. Read once per
    guest: several rules ask, and the corpus audit's speed goal counts every tree walk."""
    if "cpu_layout" not in guest.derived:
        guest.derived["cpu_layout"] = _read_layout(guest)
    layout: CpuLayout | None = guest.derived["cpu_layout"]
    return layout


def kids(el: Any, *tags: str) -> dict[str, Any]:
    """``el``'s children named ``tags``, the first of each: lxml filters them in C, several times
    cheaper than find() or a Python loop over every child (the corpus audit's speed goal)."""
    out: dict[str, Any] = {}
    for child in el.iterchildren(*tags):
        out.setdefault(child.tag, child)
    return out


def _read_layout(guest: Guest) -> CpuLayout | None:
    if guest.tree is None:
        return None
    top = top_elements(guest)  # <vcpu>, <cputune>, <cpu>, <numatune>
    out = CpuLayout()
    vcpu = top.get("vcpu")
    if vcpu is not None:
        out.vcpu_cpuset = _cpus(vcpu.get("cpuset"))
        out.max_vcpus = _int((vcpu.text or "").strip() or None)
    out.memory_stated_kib = memory_kib(top.get("memory"))
    if top.get("cputune") is not None:
        _read_pins(out, top["cputune"])
    if top.get("cpu") is not None:
        _read_cpu(out, top["cpu"])
    numatune = top.get("numatune")
    mem = kids(numatune, "memory").get("memory") if numatune is not None else None
    if mem is not None:
        out.numatune_mode = "auto" if mem.get("placement") == "auto" else mem.get("mode", "strict")
        nodeset = mem.get("nodeset")
        out.numatune_nodeset = _cpus(nodeset) if nodeset else None
    return out


def _read_pins(out: CpuLayout, tune: Any) -> None:
    """<cputune>: <vcpupin>, <emulatorpin>, <iothreadpin>."""
    for pin in tune:
        if pin.tag == "vcpupin":
            n, cpus = _int(pin.get("vcpu")), _cpus(pin.get("cpuset"))
            if n is not None and cpus:
                out.vcpupins[n] = cpus
        elif pin.tag == "emulatorpin":
            out.emulatorpin = _cpus(pin.get("cpuset"))
        elif pin.tag == "iothreadpin":
            n, cpus = _int(pin.get("iothread")), _cpus(pin.get("cpuset"))
            if n is not None and cpus:
                out.iothreadpins[n] = cpus


def _read_cpu(out: CpuLayout, cpu: Any) -> None:
    """<cpu migratable=…>: <topology>, <numa> cells, <feature>s."""
    out.migratable = cpu.get("migratable")
    for child in cpu:
        if child.tag == "topology":
            for key in ("sockets", "dies", "clusters", "cores", "threads"):
                value = _int(child.get(key))
                if value is not None and value > 0:
                    out.topology[key] = value
        elif child.tag == "numa":
            out.cells = [_cell(c) for c in child.iterchildren("cell")]
            out.numa_cells = len(out.cells)
        elif child.tag == "feature" and child.get("name"):
            out.features[child.get("name")] = child.get("policy", "require")


def _cell(cell: Any) -> NumaCell:
    """A <cell id cpus memory unit>; a cell without cpus= (memory-only, libvirt >= 6.x) has none."""
    size = xml_int(cell.get("memory"))
    return NumaCell(id=_int(cell.get("id")), cpus=frozenset(_cpus(cell.get("cpus"))),
                    memory_kib=unit_kib(size, cell.get("unit")) if size is not None else None,
                    cpus_text=cell.get("cpus"))
