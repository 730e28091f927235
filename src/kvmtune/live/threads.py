"""Every thread of the host at one instant, and who each one is (``kvmtune why``'s "who ran instead").

One read of ``/proc/<pid>/task/<tid>/stat`` per thread per tick gives its CPU time (user plus system
ticks), the CPU it last ran on and whether it is a kernel thread; that is all the attribution needs, so
a tick costs one small read per thread. The threads of interest (the guest's vCPUs) are read more closely
by the caller (``schedstat`` for nanosecond run delay, ``status`` for affinity).

Threads are grouped into owners: a guest's vCPUs, the same guest's other QEMU threads (emulator, I/O
threads, workers), its vhost workers (kernel threads named ``vhost-<qemu pid>``), other kernel threads,
and host processes by command name.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvmtune.host.root import HostRoot
from kvmtune.live.sources import vcpu_index
from kvmtune.qemu.argv import parse_keyval, parse_options, split_proc_cmdline

PF_KTHREAD = 0x00200000


@dataclass(frozen=True)
class ThreadStat:
    pid: int  # the process (thread group)
    tid: int
    comm: str
    ticks: int  # utime + stime, in clock ticks
    cpu: int  # the CPU it last ran on
    kernel: bool


def parse_thread_stat(pid: int, text: str) -> ThreadStat | None:
    """``/proc/<pid>/task/<tid>/stat`` (proc(5)): comm may hold spaces and parentheses."""
    lpar, rpar = text.find("("), text.rfind(")")
    if lpar < 0 or rpar < lpar:
        return None
    rest = text[rpar + 1:].split()
    try:
        tid = int(text[:lpar].strip())
        flags, utime, stime, cpu = int(rest[6]), int(rest[11]), int(rest[12]), int(rest[36])
    except (ValueError, IndexError):
        return None
    return ThreadStat(pid, tid, text[lpar + 1:rpar], utime + stime, cpu, bool(flags & PF_KTHREAD))


def read_threads(host: HostRoot) -> dict[int, ThreadStat]:
    """Every thread of the host, by thread id (threads that end while being read are skipped)."""
    out: dict[int, ThreadStat] = {}
    for entry in host.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        for tid in host.listdir(f"/proc/{pid}/task"):
            text = host.read_optional(f"/proc/{pid}/task/{tid}/stat")
            if text:
                st = parse_thread_stat(pid, text)
                if st is not None:
                    out[st.tid] = st
    return out


def qemu_name(host: HostRoot, pid: int) -> str | None:
    """The guest name a QEMU process carries (``-name guest=N`` or ``-name N``), None when not QEMU or unnamed."""
    exe = (host.readlink(f"/proc/{pid}/exe") or "").removesuffix(" (deleted)").rsplit("/", 1)[-1]
    if not exe.startswith(("qemu-system-", "qemu-kvm")):
        return None
    raw = host.read_bytes(f"/proc/{pid}/cmdline", limit=1024 * 1024)
    if not raw:
        return None
    try:
        _, options = parse_options(split_proc_cmdline(raw))
    except ValueError:
        return f"pid-{pid}"
    for opt in options:
        if opt.name == "-name" and opt.value:
            name = parse_keyval(opt.value, "guest").get("guest")
            if name:
                return str(name)
    return f"pid-{pid}"


@dataclass(frozen=True)
class Owner:
    """Who a thread belongs to, as ``why`` names it."""

    kind: str  # guest-vcpu | qemu | vhost | kernel | process
    name: str  # the guest's name, or the command
    pid: int
    detail: str = ""  # "vCPU 0", "IO iothread0"

    def label(self) -> str:
        if self.kind == "guest-vcpu":
            return f"{self.name} (pid {self.pid}, {self.detail})"
        if self.kind == "qemu":
            return f"{self.name}'s QEMU threads (pid {self.pid}: emulator, I/O threads, workers)"
        if self.kind == "vhost":
            return f"{self.name}'s vhost worker (for pid {self.pid})"
        if self.kind == "kernel":
            return f"kernel thread {self.name}"
        return f"host process {self.name} (pid {self.pid})"


class Owners:
    """Classifies threads; the names of QEMU processes are read once."""

    def __init__(self, host: HostRoot) -> None:
        self.host = host
        self._names: dict[int, str | None] = {}

    def guest_name(self, pid: int) -> str | None:
        if pid not in self._names:
            self._names[pid] = qemu_name(self.host, pid)
        return self._names[pid]

    def owner(self, t: ThreadStat) -> Owner:
        if t.comm.startswith("vhost-") and t.comm[6:].isdigit():  # a kernel thread, or (Linux 6.4+) QEMU's own
            qemu = int(t.comm[6:])
            return Owner("vhost", self.guest_name(qemu) or f"pid-{qemu}", qemu)
        if t.kernel:
            return Owner("kernel", t.comm.split("/", 1)[0], t.pid)
        name = self.guest_name(t.pid)
        if name is None:
            return Owner("process", t.comm, t.pid)
        index = vcpu_index(t.comm)
        if index is not None:
            return Owner("guest-vcpu", name, t.pid, f"vCPU {index}")
        return Owner("qemu", name, t.pid, t.comm)
