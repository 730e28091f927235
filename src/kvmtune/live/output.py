"""Rates and diagnoses as a terminal table, JSON and node_exporter textfile output."""

from __future__ import annotations

from typing import Any

from kvmtune.live.diagnose import Diagnosis
from kvmtune.live.signals import GuestRates, Rates
from kvmtune.prometheus import Metrics
from kvmtune.textsafe import safe


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v:.0%}"


def _num(v: float | None, fmt: str = "{:.0f}") -> str:
    return "–" if v is None else fmt.format(v)


def _worst_ms(g: GuestRates) -> float | None:
    values = [x for d in g.disks.values() for x in (d.read_ms, d.write_ms) if x is not None]
    return max(values) if values else None


def _sort_key(sort: str) -> Any:
    def key(g: GuestRates) -> Any:
        if sort == "guest":
            return (g.name, g.source)
        if sort == "disk":
            return -(_worst_ms(g) or 0.0)
        if sort == "net":
            return -sum(n.drops for n in g.nics.values())
        return -(g.max_vcpu_delay or 0.0)
    return key


def _unjudged(g: GuestRates) -> str:
    """A guest no signal fired for: "ok" only when every signal that applies to it was measured."""
    if g.not_measured:
        return "not measured: " + ", ".join(g.not_measured)
    return "ok"


def render_table(r: Rates, diagnoses: list[Diagnosis], sort: str, width: int | None = 160) -> str:
    """The table; rows are cut at ``width`` columns (a terminal's), never when ``width`` is None."""
    host = r.host
    psi = host.psi_some
    lines = [
        f"host: CPU {_pct(host.cpu_busy)} busy (target ≤ 80 %, seed:000)  "
        f"PSI some cpu/io/mem {_num(psi.get('cpu'), '{:.1f}')}/{_num(psi.get('io'), '{:.1f}')}/"
        f"{_num(psi.get('memory'), '{:.1f}')} %  swap in/out {_num(host.swap_in_s)}/{_num(host.swap_out_s)} pages/s  "
        f"KSM saves {_num(None if host.ksm_saved_bytes is None else host.ksm_saved_bytes / 2**20)} MiB  "
        f"halt-poll success {_pct(host.halt_poll_success)}  interval {r.interval_s:.1f} s",
    ]
    by_guest: dict[str, list[Diagnosis]] = {}
    for d in diagnoses:
        by_guest.setdefault(d.guest, []).append(d)
    for d in by_guest.get("", []):
        lines.append(safe(f"host {d.level}: {d.signal} {d.value} (≥ {d.threshold}) → {d.explanation}"))
    for signal, why in host.not_measured.items():
        lines.append(safe(f"host not measured: {signal}: {why}"))
    head = f"{'GUEST':<22} {'SOURCE':<28} {'vCPU DELAY':>10} {'vCPU BUSY':>9} {'IOPS':>7} {'DISK ms':>8} " \
           f"{'NET pps':>8} {'DROPS':>6} {'BALLOON':>7}  DIAGNOSIS"
    lines.append(head)
    for g in sorted(r.guests, key=_sort_key(sort)):
        busy = max(g.vcpu_busy.values()) if g.vcpu_busy else None
        iops = sum(d.iops for d in g.disks.values()) if g.disks else None
        pps = sum(n.pps for n in g.nics.values()) if g.nics else None
        drops = sum(n.drops for n in g.nics.values()) if g.nics else None
        # a disk's or NIC's name is the QMP device id or tap name, which a fake QEMU chooses freely
        diag = safe("; ".join(f"{d.level} {d.signal} {d.value}{', ' + d.who if d.who else ''} → {d.explanation}"
                              for d in by_guest.get(g.key, [])))
        row = (f"{safe(g.name)[:22]:<22} {_source(g)[:28]:<28} {_pct(g.max_vcpu_delay):>10} "
               f"{_pct(busy):>9} {_num(iops):>7} {_num(_worst_ms(g), '{:.1f}'):>8} {_num(pps):>8} "
               f"{_num(drops):>6} {_pct(g.balloon_fraction):>7}  {diag or _unjudged(g)}")
        lines.append(row[:width] if width is not None and width > 40 else row)
    if not r.guests:
        lines.append("(no running guest found)")
    lines.extend(f"note: {safe(n)}" for n in r.notes)
    return "\n".join(lines)


def _source(g: GuestRates) -> str:
    """Where a guest was found and, for a QEMU libvirt did not start, who runs it: any user may start a QEMU
    under any -name (``pid 4242 (mallory)``; a name too long for the column is whole in the JSON)."""
    return f"{safe(g.source)} ({safe(g.owner)})" if g.owner else safe(g.source)


def _diag_json(d: Diagnosis) -> dict[str, Any]:
    return {"signal": d.signal, "level": d.level, "value": d.value, "threshold": d.threshold, "who": d.who or None,
            "rules": d.rules, "explanation": d.explanation, "fix": d.fix}


def rates_json(r: Rates, diagnoses: list[Diagnosis]) -> dict[str, Any]:
    guests = []
    for g in r.guests:
        guests.append({
            "key": g.key, "id": g.identity, "name": g.name, "source": g.source, "owner": g.owner or None,
            "vcpu_delay": {str(k): v for k, v in g.vcpu_delay.items()},
            "vcpu_busy": {str(k): v for k, v in g.vcpu_busy.items()},
            "disks": {k: vars(v) for k, v in g.disks.items()},
            "nics": {k: vars(v) for k, v in g.nics.items()},
            "memory_kib": g.memory_kib, "balloon_kib": g.balloon_kib, "balloon_fraction": g.balloon_fraction,
            "halt_poll_success": g.halt_poll_success, "tps": g.tps,
            "diagnoses": [_diag_json(d) for d in diagnoses if d.guest == g.key],
            "not_measured": dict(g.not_measured),
        })
    return {"interval_s": r.interval_s, "host": vars(r.host), "guests": guests,
            "host_diagnoses": [_diag_json(d) for d in diagnoses if d.guest == ""], "notes": r.notes}


def _series(g: GuestRates) -> dict[str, str]:
    """A guest's labels: its stable identity, never its pid, so a restarted guest continues its series."""
    labels = {"guest": g.name, "id": g.identity, "source": "qemu" if g.source.startswith("pid ") else g.source}
    if g.owner:  # a QEMU libvirt did not start: who runs it (a user name or uid, steady across its restarts)
        labels["owner"] = g.owner
    return labels


def prometheus_text(r: Rates, diagnoses: list[Diagnosis]) -> str:
    """node_exporter textfile-collector output (gauges over the sampled interval)."""
    m = Metrics()
    m.add("kvmtune_sample_interval_seconds", "Length of the interval the rates were measured over.", {}, r.interval_s)
    if r.host.cpu_busy is not None:
        m.add("kvmtune_host_cpu_busy_ratio", "Host CPU use over the interval (seed:000 target: 0.8).", {},
              r.host.cpu_busy)
    for res, v in sorted(r.host.psi_some.items()):
        m.add("kvmtune_host_pressure_some_avg10_percent", "PSI 'some' avg10 per resource.", {"resource": res}, v)
    for res, v in sorted(r.host.psi_full.items()):
        m.add("kvmtune_host_pressure_full_avg10_percent", "PSI 'full' avg10 per resource.", {"resource": res}, v)
    if r.host.ksm_saved_bytes is not None:
        m.add("kvmtune_host_ksm_saved_bytes", "Memory KSM saves (pages_sharing x page size).", {},
              r.host.ksm_saved_bytes)
    for g in r.guests:
        base = _series(g)
        for i, v in sorted(g.vcpu_delay.items()):
            m.add("kvmtune_guest_vcpu_delay_ratio", "Time a vCPU waited for a host CPU, per second.",
                  {**base, "vcpu": str(i)}, v)
        for name, d in sorted(g.disks.items()):
            labels = {**base, "disk": name}
            m.add("kvmtune_guest_disk_operations_per_second", "Disk reads plus writes per second.", labels, d.iops)
            m.add("kvmtune_guest_disk_bytes_per_second", "Disk bytes read plus written per second.", labels,
                  d.mb_s * 1e6)
            for op, ms in (("read", d.read_ms), ("write", d.write_ms), ("flush", d.flush_ms)):
                if ms is not None:
                    m.add("kvmtune_guest_disk_latency_seconds", "Mean time per disk operation.",
                          {**labels, "op": op}, ms / 1e3)
        for name, n in sorted(g.nics.items()):
            labels = {**base, "interface": name}
            m.add("kvmtune_guest_net_packets_per_second", "Packets sent plus received per second.", labels, n.pps)
            m.add("kvmtune_guest_net_drop_ratio", "Dropped packets as a fraction of all packets.", labels,
                  n.drop_fraction)
        if g.balloon_fraction is not None:
            m.add("kvmtune_guest_balloon_ratio", "Balloon size over the guest's defined memory.", base,
                  g.balloon_fraction)
    names = {g.key: g for g in r.guests}
    for diag in diagnoses:
        who = names.get(diag.guest)
        labels = {**(_series(who) if who else {"guest": "", "id": "", "source": "host"}), "signal": diag.signal,
                  "level": diag.level, "rules": ",".join(diag.rules) or "none"}
        m.add("kvmtune_diagnosis", "A live signal past its threshold, with the rules that explain it.", labels, 1)
    return m.text()
