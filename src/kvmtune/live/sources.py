"""Where live counters come from, cheapest first, each optional.

- The host: /proc/stat, PSI, /proc/vmstat, KSM's counters, KVM's debugfs halt-polling counters.
- QEMU processes that libvirt does not manage: vCPU threads' schedstat (run delay), QMP
  ``query-blockstats`` on the process's own monitor socket, the tap's sysfs counters.
- libvirt's bulk stats for the guests it manages (libvirt owns their QMP monitor, so kvmtune
  never connects to it; measured at ~9 ms a domain, so only the groups used here are asked for).

Every read of /proc and /sys goes through :class:`HostRoot`. A source that is not available
says so in one line in ``Snapshot.notes`` and the sample goes on.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from pathlib import Path
from typing import Any

from kvmtune.errors import InputError, KvmtuneError
from kvmtune.host.facts import HostFacts
from kvmtune.host.parsers import parse_proc_stat
from kvmtune.host.root import HostRoot
from kvmtune.host.sockets import SocketChanged, same_socket
from kvmtune.live.model import (
    DiskCounters,
    GuestSample,
    HostSample,
    NicCounters,
    Pressure,
    Snapshot,
    VcpuCounters,
)
from kvmtune.model.guest import Guest
from kvmtune.qemu.argv import parse_keyval, parse_options, split_proc_cmdline
from kvmtune.qemu.cmdline import guest_from_argv
from kvmtune.qemu.process import running_qemu_guests
from kvmtune.qemu.qmp import Qmp

QMP_TIMEOUT_S = 1.0
# a QMP that did not answer (a busy QEMU greets late: a TCG guest sharing a saturated CPU) is tried again after this
# long, not given up on for the whole session, nor waited on every interval
QMP_RETRY_S = 5.0
AFFINITY_EVERY = 5  # samples between reads of a vCPU thread's affinity (10 s at top's 2 s interval)
KVM_DEBUGFS = "/sys/kernel/debug/kvm"
QEMU_NAMES = ("qemu-system-", "qemu-kvm")


def parse_pressure(text: str) -> Pressure:
    """``/proc/pressure/<resource>``: 'some avg10=… avg60=… avg300=… total=…' (and 'full …')."""
    out = Pressure()
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        fields = dict(part.split("=", 1) for part in rest.split() if "=" in part)
        try:
            value = float(fields["avg10"])
        except (KeyError, ValueError):
            continue
        if kind == "some":
            out.some_avg10 = value
        elif kind == "full":
            out.full_avg10 = value
    return out


def parse_schedstat(text: str) -> tuple[int, int] | None:
    """``/proc/<pid>/task/<tid>/schedstat``: (ns on CPU, ns runnable but waiting)."""
    parts = text.split()
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    return int(parts[0]), int(parts[1])


def vcpu_index(comm: str) -> int | None:
    """QEMU names vCPU threads 'CPU <n>/KVM' (or '/TCG', '/HVF'); other threads are not vCPUs.

    Single-threaded TCG (``-accel tcg,thread=single``) runs every vCPU on one thread, 'ALL CPUs/TCG': it
    counts as vCPU 0, the only place the guest's CPU time and run delay can be read.
    """
    comm = comm.strip()
    if comm == "ALL CPUs/TCG":
        return 0
    if not comm.startswith("CPU ") or "/" not in comm:
        return None
    number = comm[4:].split("/", 1)[0]
    return int(number) if number.isdigit() else None


def _status_field(text: str, name: str) -> str | None:
    for line in text.splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].strip()
    return None


def _cpu_list(text: str) -> frozenset[int] | None:
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return None
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(cpus)


def sample_host(host: HostRoot) -> HostSample:
    facts = HostFacts(host, probe=False, guests=running_qemu_guests)
    out = HostSample(page_size=facts.page_size)
    text = host.read_optional("/proc/stat")
    if text:
        with contextlib.suppress(ValueError):
            out.cpu = parse_proc_stat(text)
    out.online_cpus = facts.cpu_count
    for resource in ("cpu", "io", "memory"):
        psi = host.read_optional(f"/proc/pressure/{resource}")
        if psi is not None:
            out.pressure[resource] = parse_pressure(psi)
    vmstat = host.read_optional("/proc/vmstat") or ""
    for line in vmstat.splitlines():
        key, _, value = line.partition(" ")
        if key in ("pswpin", "pswpout") and value.strip().isdigit():
            setattr(out, key, int(value))
    for name, attr in (("pages_shared", "ksm_shared"), ("pages_sharing", "ksm_sharing")):
        ksm = host.read_optional(f"/sys/kernel/mm/ksm/{name}")
        if ksm and ksm.strip().isdigit():
            setattr(out, attr, int(ksm))
    out.halt_poll_success, out.halt_poll_attempted = _halt_poll(host, KVM_DEBUGFS)
    return out


def _halt_poll(host: HostRoot, directory: str) -> tuple[int | None, int | None]:
    success = host.read_optional(f"{directory}/halt_successful_poll")
    attempted = host.read_optional(f"{directory}/halt_attempted_poll")
    if not success or not attempted or not success.strip().isdigit() or not attempted.strip().isdigit():
        return None, None
    return int(success), int(attempted)


def process_owner(host: HostRoot, pid: int) -> str:
    """Who runs ``pid`` (its real uid, ``/proc/PID/status`` ``Uid``): the user's name in the host's user database
    (the tree's ``/etc/passwd`` under ``--root``), else ``uid N``; "" when the status cannot be read."""
    uid = (_status_field(host.read_optional(f"/proc/{pid}/status") or "", "Uid") or "").split()[:1]
    if not uid or not uid[0].isdigit():
        return ""
    if host.is_live:
        import pwd

        try:
            return pwd.getpwuid(int(uid[0])).pw_name
        except (KeyError, OverflowError):
            return f"uid {uid[0]}"
    for line in (host.read_optional("/etc/passwd") or "").splitlines():
        fields = line.split(":")
        if len(fields) > 2 and fields[2] == uid[0] and fields[0]:
            return fields[0]
    return f"uid {uid[0]}"


class ProcQemuSource:
    """QEMU processes found in /proc that no libvirt manages, read without disturbing them.

    A process counts as QEMU only when its executable (``/proc/PID/exe``) is a QEMU binary: any user
    can name a process ``qemu-system-x86_64``. Its QMP socket is used only when it is a socket owned by
    the process's own user, and every QMP call has a 1 s time-out.
    """

    def __init__(self, host: HostRoot, exclude_pids: set[int] | None = None, only_pids: set[int] | None = None) -> None:
        self.host = host
        self.exclude_pids = exclude_pids or set()
        self.only_pids = only_pids  # None: every QEMU process
        self._qmp: dict[int, Qmp | None] = {}
        self._qmp_retry: dict[int, float] = {}  # pid -> when a QMP that did not answer is tried again (monotonic)
        self._argv: dict[int, list[str]] = {}
        self._threads: dict[int, dict[int, str]] = {}
        self._models: dict[int, Guest] = {}
        self._tap_names: dict[int, list[str]] = {}
        self._owners: dict[int, str] = {}
        self._affinity: dict[tuple[int, str], frozenset[int] | None] = {}
        self._round = 0

    def _map(self, path: str) -> Path:
        return Path(self.host.path) / path.lstrip("/")

    def qemu_pids(self) -> list[int]:
        pids = []
        for entry in self.host.listdir("/proc"):
            if not entry.isdigit() or int(entry) in self.exclude_pids:
                continue
            if self.only_pids is not None and int(entry) not in self.only_pids:
                continue
            exe = self.host.readlink(f"/proc/{entry}/exe") or ""
            base = exe.removesuffix(" (deleted)").rsplit("/", 1)[-1]
            if base.startswith(QEMU_NAMES):
                pids.append(int(entry))
        return pids

    def sample(self, snap: Snapshot) -> None:
        self._round += 1
        live = set()
        for pid in self.qemu_pids():
            live.add(pid)
            try:
                guest = self._sample_pid(pid)
            except OSError as exc:  # gone mid-sample, or unreadable
                snap.notes.append(f"pid {pid}: not sampled ({exc.strerror or exc})")
                continue
            except InputError as exc:  # any user's QEMU command line kvmtune cannot read: that process, not the run
                snap.notes.append(f"pid {pid}: not sampled ({exc.problem})")
                continue
            if guest is not None:
                snap.guests[guest.key] = guest
        for pid in set(self._qmp) - live:
            self._drop(pid)

    def _drop(self, pid: int) -> None:
        self._qmp_retry.pop(pid, None)
        qmp = self._qmp.pop(pid, None)
        if qmp is not None:
            qmp.close()
        self._argv.pop(pid, None)
        self._threads.pop(pid, None)
        self._models.pop(pid, None)
        self._tap_names.pop(pid, None)
        self._owners.pop(pid, None)
        for key in [k for k in self._affinity if k[0] == pid]:
            del self._affinity[key]

    def close(self) -> None:
        for pid in list(self._qmp):
            self._drop(pid)

    def qmp(self, pid: int) -> Qmp | None:
        """The QMP connection a sample opened to ``pid`` (checked as :meth:`_connect` says), if any."""
        return self._qmp.get(pid)

    def vcpu_threads(self, pid: int) -> dict[int, str]:
        """vCPU index -> thread id, as the samples found them (thread names, else QMP)."""
        return self._vcpu_threads(pid, self._qmp.get(pid))

    def _sample_pid(self, pid: int) -> GuestSample | None:
        argv = self._argv.get(pid)
        if argv is None:
            raw = self.host.read_bytes(f"/proc/{pid}/cmdline", limit=1024 * 1024)
            if not raw:
                return None
            argv = split_proc_cmdline(raw)
            self._argv[pid] = argv
        model = self._models.get(pid)
        if model is None:  # a command line never changes: parsed once per process, as it is read once
            try:
                model = guest_from_argv(argv, f"pid {pid}")
            except ValueError:
                return None
            model.on_audited_host = self.host.is_live  # a running process of the host being sampled
            self._models[pid] = model
        name = model.name if model.name and model.name != "?" else f"pid-{pid}"
        identity = (f"uuid:{model.uuid.strip().lower()}" if model.uuid else
                    f"name:{model.name}" if model.name and model.name != "?" else f"pid:{pid}")
        owner = self._owners.get(pid)
        if owner is None:
            owner = self._owners[pid] = process_owner(self.host, pid)
        g = GuestSample(key=f"pid:{pid}:{name}", name=name, source=f"pid {pid}", pid=pid, guest=model,
                        memory_kib=model.memory_kib, identity=identity, owner=owner)
        qmp = self._connect(pid, argv, g)
        for index, tid in self._vcpu_threads(pid, qmp).items():
            counters = parse_schedstat(self.host.read_optional(f"/proc/{pid}/task/{tid}/schedstat") or "")
            if counters is None:
                g.notes.append(f"vCPU {index}: schedstat not readable")
                continue
            g.vcpus[index] = VcpuCounters(counters[0], counters[1], self._allowed(pid, tid))
        if not g.vcpus:
            g.notes.append("vCPUs: threads not identified (no -name debug-threads=on and no QMP)")
        self._disks(pid, qmp, g)
        self._taps(pid, argv, g)
        return g

    def _allowed(self, pid: int, tid: str) -> frozenset[int] | None:
        """A vCPU thread's affinity, read again every ``AFFINITY_EVERY`` samples (pinning seldom changes)."""
        key = (pid, tid)
        if key not in self._affinity or self._round % AFFINITY_EVERY == 0:
            allowed = _status_field(self.host.read_optional(f"/proc/{pid}/task/{tid}/status") or "",
                                    "Cpus_allowed_list")
            self._affinity[key] = _cpu_list(allowed) if allowed else None
        return self._affinity[key]

    def _monitor_path(self, argv: list[str]) -> str | None:
        try:
            _, options = parse_options(argv)
        except ValueError:
            return None
        chardevs: dict[str, str] = {}
        monitors: list[str] = []
        for opt in options:
            value = opt.value or ""
            if opt.name == "-qmp" and value.startswith("unix:"):
                return value[5:].split(",", 1)[0]
            if opt.name == "-chardev":
                props = parse_keyval(value, "backend")
                if props.get("backend") in ("socket",) and props.get("path") and props.get("id"):
                    chardevs[str(props["id"])] = str(props["path"])
            if opt.name == "-mon":
                props = parse_keyval(value, "chardev")
                if props.get("mode") == "control":
                    monitors.append(str(props.get("chardev")))
        for mon in monitors:
            if mon in chardevs:
                return chardevs[mon]
        return None

    def _connect(self, pid: int, argv: list[str], g: GuestSample) -> Qmp | None:
        retry = self._qmp_retry.get(pid)
        if pid in self._qmp and (retry is None or time.monotonic() < retry):
            return self._qmp[pid]
        self._qmp_retry.pop(pid, None)
        self._qmp[pid] = None
        path = self._monitor_path(argv)
        if path is None:
            g.notes.append("disks: no QMP socket on its command line (add -qmp unix:PATH,server=on,wait=off)")
            return None
        owner = _status_field(self.host.read_optional(f"/proc/{pid}/status") or "", "Uid")
        try:
            st = os.stat(self._map(path), follow_symlinks=False)
        except OSError as exc:
            g.notes.append(f"disks: QMP socket not usable ({exc.strerror})")
            return None
        if not stat.S_ISSOCK(st.st_mode) or owner is None or str(st.st_uid) != owner.split()[0]:
            g.notes.append("disks: the QMP path is not a socket owned by the process's user; not opened")
            return None
        try:
            # the path is the QEMU process owner's to change: connect to the socket just checked, not a link
            with same_socket(str(self._map(path)), st) as reachable:
                self._qmp[pid] = Qmp(Path(reachable), timeout=QMP_TIMEOUT_S)
        except SocketChanged:
            g.notes.append("disks: the QMP socket changed after it was checked; not opened")
        except (OSError, ValueError, KvmtuneError) as exc:
            g.notes.append(f"disks: QMP did not answer ({exc.__class__.__name__}); tried again in {QMP_RETRY_S:g} s")
            self._qmp_retry[pid] = time.monotonic() + QMP_RETRY_S
        return self._qmp[pid]

    def _vcpu_threads(self, pid: int, qmp: Qmp | None) -> dict[int, str]:
        """vCPU index -> thread id: from thread names (debug-threads=on), else QMP ``query-cpus-fast``."""
        if pid in self._threads:
            return self._threads[pid]
        threads: dict[int, str] = {}
        for tid in self.host.listdir(f"/proc/{pid}/task"):
            index = vcpu_index(self.host.read_optional(f"/proc/{pid}/task/{tid}/comm") or "")
            if index is not None:
                threads[index] = tid
        if not threads and qmp is not None:
            with contextlib.suppress(OSError, ValueError, KvmtuneError):
                for cpu in qmp.execute("query-cpus-fast") or []:
                    if isinstance(cpu.get("thread-id"), int) and isinstance(cpu.get("cpu-index"), int):
                        threads[cpu["cpu-index"]] = str(cpu["thread-id"])
        if threads:
            self._threads[pid] = threads
        return threads

    def _disks(self, pid: int, qmp: Qmp | None, g: GuestSample) -> None:
        if qmp is None:
            return
        try:
            stats: Any = qmp.execute("query-blockstats")
        except (OSError, ValueError, KvmtuneError) as exc:
            g.notes.append(f"disks: query-blockstats failed ({exc.__class__.__name__}); will reconnect")
            self._drop(pid)
            return
        for entry in stats if isinstance(stats, list) else []:
            s = entry.get("stats") or {}
            name = str(entry.get("device") or entry.get("qdev") or entry.get("node-name") or "?")
            name = name.removeprefix("/machine/peripheral/").removesuffix("/virtio-backend")
            g.disks[name] = DiskCounters(
                rd_ops=int(s.get("rd_operations", 0)), wr_ops=int(s.get("wr_operations", 0)),
                fl_ops=int(s.get("flush_operations", 0)), rd_bytes=int(s.get("rd_bytes", 0)),
                wr_bytes=int(s.get("wr_bytes", 0)), rd_ns=int(s.get("rd_total_time_ns", 0)),
                wr_ns=int(s.get("wr_total_time_ns", 0)), fl_ns=int(s.get("flush_total_time_ns", 0)),
            )

    def _tap_list(self, pid: int, argv: list[str]) -> list[str]:
        """The tap interfaces a command line names (read once per process)."""
        if pid in self._tap_names:
            return self._tap_names[pid]
        taps: list[str] = []
        try:
            _, options = parse_options(argv)
        except ValueError:
            options = []
        for opt in options:
            if opt.name != "-netdev":
                continue
            props = parse_keyval(opt.value or "", "type")
            ifname = props.get("ifname")
            if props.get("type") == "tap" and ifname and "/" not in str(ifname):
                taps.append(str(ifname))
        self._tap_names[pid] = taps
        return taps

    def _taps(self, pid: int, argv: list[str], g: GuestSample) -> None:
        for ifname in self._tap_list(pid, argv):
            base = f"/sys/class/net/{ifname}/statistics"
            values = {k: self.host.read_optional(f"{base}/{k}") for k in
                      ("rx_packets", "tx_packets", "rx_dropped", "tx_dropped")}
            if any(v is None or not v.strip().isdigit() for v in values.values()):
                g.notes.append(f"net {ifname}: counters not readable here (another network namespace?)")
                continue
            # the tap's rx is what the guest sent; keep the guest's point of view
            g.nics[str(ifname)] = NicCounters(
                rx_pkts=int(values["tx_packets"] or 0), tx_pkts=int(values["rx_packets"] or 0),
                rx_drop=int(values["tx_dropped"] or 0), tx_drop=int(values["rx_dropped"] or 0),
            )


def libvirt_pids(host: HostRoot) -> set[int]:
    """PIDs of the QEMU processes libvirt manages (its pidfiles), so they are read through libvirt."""
    pids = set()
    for path in host.glob("/run/libvirt/qemu/*.pid"):
        text = host.read_optional(path)
        if text and text.strip().isdigit():
            pids.add(int(text.strip()))
    return pids


def guest_from_libvirt_record(uri: str, name: str, record: dict[str, Any]) -> GuestSample:
    """One ``virConnectGetAllDomainStats`` record (flat 'group.N.field' keys) as counters."""
    g = GuestSample(key=f"{uri}#{name}", name=name, source=uri)

    def num(key: str) -> int:
        value = record.get(key, 0)
        return int(value) if isinstance(value, (int, float)) else 0

    for i in range(num("vcpu.maximum") or num("vcpu.current")):
        if f"vcpu.{i}.time" in record:
            g.vcpus[i] = VcpuCounters(num(f"vcpu.{i}.time"), num(f"vcpu.{i}.delay"))
    for i in range(num("block.count")):
        name_i = str(record.get(f"block.{i}.name", i))
        g.disks[name_i] = DiskCounters(
            rd_ops=num(f"block.{i}.rd.reqs"), wr_ops=num(f"block.{i}.wr.reqs"), fl_ops=num(f"block.{i}.fl.reqs"),
            rd_bytes=num(f"block.{i}.rd.bytes"), wr_bytes=num(f"block.{i}.wr.bytes"),
            rd_ns=num(f"block.{i}.rd.times"), wr_ns=num(f"block.{i}.wr.times"), fl_ns=num(f"block.{i}.fl.times"),
        )
    for i in range(num("net.count")):
        name_i = str(record.get(f"net.{i}.name", i))
        # libvirt reports the host side of the tap too; swap to the guest's point of view
        g.nics[name_i] = NicCounters(
            rx_pkts=num(f"net.{i}.tx.pkts"), tx_pkts=num(f"net.{i}.rx.pkts"),
            rx_drop=num(f"net.{i}.tx.drop"), tx_drop=num(f"net.{i}.rx.drop"),
        )
    if "balloon.current" in record:
        g.balloon_kib = num("balloon.current")
    if "balloon.maximum" in record:
        g.memory_kib = num("balloon.maximum")
    return g


def _vcpu_affinity(dom: Any) -> dict[int, frozenset[int]]:
    """Which host CPUs each vCPU may run on (read once per domain: pinning seldom changes)."""
    try:
        _, cpumaps = dom.vcpus()
    except Exception:  # libvirt raises its own error type; an inactive or vanished domain has none
        return {}
    return {i: frozenset(c for c, allowed in enumerate(m) if allowed) for i, m in enumerate(cpumaps)}


class LibvirtSource:
    """libvirt's bulk stats for every running domain of one URI (read-only connection)."""

    def __init__(self, uri: str) -> None:
        from kvmtune.audit.collect import is_local_uri
        from kvmtune.domain.connection import open_readonly

        self.uri = uri
        self.conn: Any = open_readonly(uri)
        self.local = is_local_uri(uri)
        self._models: dict[str, Any] = {}
        self._affinity: dict[str, dict[int, frozenset[int]]] = {}

    def sample(self, snap: Snapshot) -> None:
        import libvirt

        from kvmtune.domain.xml import guest_from_tree, parse_xml_bytes

        groups = (libvirt.VIR_DOMAIN_STATS_CPU_TOTAL | libvirt.VIR_DOMAIN_STATS_BALLOON
                  | libvirt.VIR_DOMAIN_STATS_VCPU | libvirt.VIR_DOMAIN_STATS_INTERFACE
                  | libvirt.VIR_DOMAIN_STATS_BLOCK)
        try:
            records = self.conn.getAllDomainStats(groups, libvirt.VIR_CONNECT_GET_ALL_DOMAINS_STATS_ACTIVE)
        except libvirt.libvirtError as exc:
            snap.notes.append(f"{self.uri}: libvirt stats not available ({str(exc).splitlines()[0]})")
            return
        for dom, record in records:
            try:
                name, uuid = dom.name(), dom.UUIDString()
                g = guest_from_libvirt_record(self.uri, name, record)
                g.identity = f"uuid:{uuid.lower()}"
                if uuid not in self._models:
                    origin = f"{self.uri}#{name}"
                    model = guest_from_tree(parse_xml_bytes(dom.XMLDesc(0).encode(), origin), origin, "libvirt")
                    model.on_audited_host = self.local  # its images are this host's only through a local URI
                    self._models[uuid] = model
                    self._affinity[uuid] = _vcpu_affinity(dom)
                g.guest = self._models[uuid]
                for index, cpus in self._affinity[uuid].items():
                    if index in g.vcpus:
                        g.vcpus[index].allowed_cpus = cpus
                snap.guests[g.key] = g
            except (libvirt.libvirtError, KvmtuneError) as exc:  # a domain that went away mid-sample
                snap.notes.append(f"{self.uri}: a domain was not sampled ({str(exc).splitlines()[0]})")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()


class Sampler:
    """All available sources; ``snapshot()`` reads each once."""

    def __init__(self, host: HostRoot, uris: list[str], *, processes: bool = True,
                 only_pids: set[int] | None = None) -> None:
        self.host = host
        self.notes: list[str] = []
        self.libvirt: list[LibvirtSource] = []
        for uri in uris:
            try:
                self.libvirt.append(LibvirtSource(uri))
            except KvmtuneError as exc:
                self.notes.append(f"libvirt: not available ({exc})")
        self.procs = ProcQemuSource(host, libvirt_pids(host), only_pids) if processes else None
        if host.read_optional(f"{KVM_DEBUGFS}/halt_attempted_poll") is None:
            self.notes.append("KVM halt-polling counters: not available (debugfs not mounted, or kernel lockdown)")
        if host.read_optional("/proc/pressure/cpu") is None:
            self.notes.append("PSI: not available (kernel without CONFIG_PSI, or psi=0)")

    def snapshot(self) -> Snapshot:
        snap = Snapshot(t=time.monotonic(), host=sample_host(self.host), notes=list(self.notes))
        for source in self.libvirt:
            source.sample(snap)
        if self.procs is not None:
            self.procs.sample(snap)
        return snap

    def close(self) -> None:
        for source in self.libvirt:
            source.close()
        if self.procs is not None:
            self.procs.close()

