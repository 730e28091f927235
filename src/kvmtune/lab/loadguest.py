"""``kvmtune guest run``: the probe guest with a steady load, to watch with ``top``, ``why`` and ``sample``.

It is started as libvirt and Proxmox VE start QEMU: ``-name N,debug-threads=on`` (named vCPU, I/O and worker
threads) and a QMP socket, so every live source has what it reads. The load:

- ``cpu``: one busy loop per vCPU;
- ``disk``: fio random reads and writes on a scratch raw image (deleted afterwards), virtio-blk, cache=none;
  ``libaio`` at depth 1 unless ``--job`` says otherwise: ``--job 'rw=randrw rwmixread=70 bs=16k iodepth=8'`` appends
  fio options after these defaults and overrides them (:func:`parse_job`: allow-listed keys, plain values, one line
  naming the token refused), so a test or a demonstration can plant a known pattern (``kvmtune capture``);
- ``net``: ``netload`` (put into the initramfs) streams from the guest, one 5 s round after another, to a
  ``netload serve`` kvmtune starts on the host's loopback, through a virtio-net NIC on QEMU's user-mode network
  (slirp: its host address 10.0.2.2 is the host's 127.0.0.1). No tap, bridge or root is needed, so there is no
  vhost worker and no host-side NIC counter either: ``why`` says so and names KVM-NET-003; the packets are the
  work of QEMU's main loop.

The accelerator is the one ``kvmtune guest accel`` finds: under TCG every number the guest shows is an
emulation number, and ``why`` says so.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shlex
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kvmtune.errors import KvmtuneError
from kvmtune.lab.guest import ProbeGuest
from kvmtune.lab.qemu import Disk, GuestRun, Nic, VmSpec
from kvmtune.qemuopts import OptionError, Text, fio_option, keyval
from kvmtune.runner import Runner

LOADS = ("cpu", "disk", "net")
NET_MODULES = ("virtio_pci", "virtio_net")
NET_WORKLOAD = "str-writex30k"  # a steady TCP stream from the guest (netload's seed workload, 30 kB writes)
SLIRP_HOST = "10.0.2.2"  # the host as QEMU's user-mode network shows it (its loopback)

# --load disk: fio's options before --job's (the disk, the run's length and O_DIRECT are not --job's to change)
DISK_DEFAULTS: dict[str, str] = {"rw": "randrw", "bs": "4k", "ioengine": "libaio", "iodepth": "1"}
DISK_FIXED = ("--name=load", "--filename=/dev/vda", "--direct=1", "--time_based", "--runtime=86400")
_SIZE = re.compile(r"[1-9][0-9]{0,12}[kmgKMG]?")
_TOKEN = re.compile(r"(?:--)?([a-z][a-z0-9_]{0,31})=([A-Za-z0-9._+-]{1,32})")


def _int_in(lo: int, hi: int) -> Callable[[str], bool]:
    return lambda v: v.isascii() and v.isdigit() and lo <= int(v) <= hi


def _one_of(*words: str) -> Callable[[str], bool]:
    return lambda v: v in words


def _size(v: str) -> bool:
    return bool(_SIZE.fullmatch(v))


def _size_range(v: str) -> bool:
    lo, _, hi = v.partition("-")
    return _size(lo) and _size(hi)


# what --job may set, and the values each takes: the pattern of the I/O, nothing that names a file, a program or an
# engine loaded from outside fio
JOB_KEYS: dict[str, Callable[[str], bool]] = {
    "rw": _one_of("read", "write", "randread", "randwrite", "rw", "readwrite", "randrw", "trim", "randtrim"),
    "readwrite": _one_of("read", "write", "randread", "randwrite", "rw", "readwrite", "randrw"),
    "rwmixread": _int_in(0, 100), "rwmixwrite": _int_in(0, 100), "percentage_random": _int_in(0, 100),
    "bs": _size, "bsrange": _size_range, "blocksize": _size, "size": _size, "offset": _size,
    "iodepth": _int_in(1, 1024), "iodepth_batch_submit": _int_in(0, 1024), "iodepth_batch_complete_min": _int_in(0, 1024),
    "fsync": _int_in(0, 1 << 20), "fdatasync": _int_in(0, 1 << 20), "rate_iops": _int_in(1, 1 << 24),
    "thinktime": _int_in(0, 10**8), "randrepeat": _int_in(0, 1), "norandommap": _int_in(0, 1),
    "ioengine": _one_of("libaio", "psync", "sync", "pvsync", "pvsync2", "io_uring"),
    "numjobs": _int_in(1, 64), "random_distribution": _one_of("random", "zipf", "pareto", "normal"),
}


def parse_job(text: str) -> dict[str, str]:
    """``--job``'s fio options as key -> value: space-separated ``key=value`` (``--key=value`` too), each key
    allow-listed (:data:`JOB_KEYS`) with its value checked, a key at most once; anything else an ``OptionError``
    whose one line names the token."""
    for ch in text:
        if not (ch == " " or (ch.isascii() and ch.isprintable())):
            raise OptionError("--job", f"holds the character {ch!r}: only space-separated key=value options")
    if len(text) > 512:
        raise OptionError("--job", f"is {len(text)} characters long (at most 512)")
    out: dict[str, str] = {}
    for token in text.split(" "):
        if not token:
            continue
        m = _TOKEN.fullmatch(token)
        if m is None:
            raise OptionError("--job", f"{token!r} is not a fio option as key=value with a plain value")
        key, value = m.groups()
        check = JOB_KEYS.get(key)
        if check is None:
            raise OptionError("--job", f"{key!r} is not an option --job may set (it may set: {', '.join(sorted(JOB_KEYS))})")
        if not check(value):
            raise OptionError("--job", f"{key}={value!r} is not a value kvmtune passes for {key}")
        if key in out:
            raise OptionError("--job", f"{key!r} is given twice")
        out[key] = value
    return out


def disk_fio_argv(job: dict[str, str] | None = None) -> list[str]:
    """The disk load's fio arguments: the defaults, then ``job`` (:func:`parse_job`) over them."""
    options = {**DISK_DEFAULTS, **(job or {})}
    if options.get("readwrite"):
        options["rw"] = options.pop("readwrite")
    return ["fio", *DISK_FIXED, *(fio_option(k, v) for k, v in options.items())]


def _insmod(guest: ProbeGuest) -> str:
    return f"for m in {' '.join(guest.module_paths)}; do insmod /lib/modules/$m 2>/dev/null; done\n"


def _net_job(guest: ProbeGuest, port: int, token: str) -> str:
    insmod = "".join(f"insmod /lib/modules/{m} 2>/dev/null\n" for m in guest.modules_for(NET_MODULES))
    return (insmod + "ip link set lo up\nip link set eth0 up\nip addr add 10.0.2.15/24 dev eth0\n"
            f"ip route add default via {SLIRP_HOST}\n"
            f"while :; do NETLOAD_TOKEN={token} netload run --workload {NET_WORKLOAD} --users 1 --duration 5s "
            f"--remote {SLIRP_HOST}:{port} -q >/dev/null 2>&1; echo KVMTUNE-NET-ROUND rc=$?; done\n")


def free_port() -> int:
    """A TCP port on the host's loopback nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def load_job(guest: ProbeGuest, load: str, smp: int, port: int = 0, token: str = "",
             job: dict[str, str] | None = None) -> str:
    """The guest's job script for ``load`` (``net``: the host's netload server's port and token; ``disk``: the fio
    options of ``--job``, already checked by :func:`parse_job`)."""
    if load == "cpu":
        return "".join("while :; do :; done &\n" for _ in range(smp)) + "wait\n"
    if load == "disk":
        return (_insmod(guest) + "while [ ! -b /dev/vda ]; do sleep 0.1; done\n"
                + " ".join(shlex.quote(a) for a in disk_fio_argv(job)) + " >/dev/null\n")
    if load == "net":
        return _net_job(guest, port, token)
    raise KvmtuneError(f"--load {load}: one of {', '.join(LOADS)}")


@dataclass
class LoadGuest:
    """One probe guest under load; ``start()`` then ``wait(seconds)``, ``close()`` always."""

    guest: ProbeGuest
    load: str
    name: str
    accel: str
    workdir: Path
    runner: Runner
    pin: str | None = None
    smp: int = 1
    netload: str | None = None  # net: the host's netload binary (the guest's copy is in its initramfs)
    job: dict[str, str] | None = None  # disk: --job's fio options (parse_job)

    def __post_init__(self) -> None:
        self.rundir = self.workdir / f"run-{self.name}-{os.getpid()}"
        self.image = self.rundir / "disk.raw"
        self.run: GuestRun | None = None
        self.server: subprocess.Popen[bytes] | None = None
        self.port, self.token = 0, ""

    def _spec(self) -> VmSpec:
        # -msg timestamp=on, as libvirt passes it: QEMU's log trace backend prefixes each event with PID@time
        # (kvmtune capture reads them from its stderr)
        extra = ["-name", keyval(("debug-threads", True), first=Text(self.name)), "-msg", keyval(("timestamp", True))]
        disks: list[Disk] = []
        if self.load == "disk":
            self.rundir.mkdir(parents=True, exist_ok=True)
            with open(self.image, "wb") as fh:
                fh.truncate(1 << 30)
            disks = [Disk(str(self.image), "raw", "virtio-blk", "none", "threads")]
        nics = [Nic("n0", keyval(("id", "n0"), ("ipv6", False), first="user"))] if self.load == "net" else []
        job = load_job(self.guest, self.load, self.smp, self.port, self.token, self.job)
        return VmSpec(guest=self.guest, accel=self.accel, smp=self.smp, job=job,
                      disks=disks, nics=nics, extra_args=extra, wrapper=["taskset", "-c", self.pin] if self.pin else [])

    def _serve(self) -> None:
        """The host end of the net load: netload's server on the loopback, for this run's token only."""
        if self.netload is None:
            raise KvmtuneError("--load net: no netload binary (build it: make -C netload)")
        self.port, self.token = free_port(), secrets.token_hex(16)
        self.server = self.runner.popen([self.netload, "serve", "-q", "--listen", f"127.0.0.1:{self.port}"],
                                        env={**os.environ, "NETLOAD_TOKEN": self.token},
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start(self) -> int:
        if self.load == "net":
            self._serve()
        self.run = GuestRun(self._spec(), self.rundir, self.runner, name=self.name)
        return self.run.start().pid

    def wait(self, seconds: float | None) -> Iterator[str]:
        """Yield console lines as they come until ``seconds`` pass (None: until QEMU ends or Ctrl-C)."""
        assert self.run is not None and self.run.proc is not None
        deadline = None if seconds is None else time.monotonic() + seconds
        pos = 0
        while self.run.proc.poll() is None and (deadline is None or time.monotonic() < deadline):
            with contextlib.suppress(OSError), open(self.run.serial, "rb") as fh:
                fh.seek(pos)
                chunk = fh.read()
                pos += len(chunk)
                yield from (line for line in chunk.decode("utf-8", "replace").splitlines() if line.startswith("KVMTUNE-"))
            time.sleep(0.2)
        if self.run.proc.poll() is not None:
            err = self.run.stderr_path.read_bytes()[-400:].decode("utf-8", "replace").strip().splitlines()
            raise KvmtuneError(f"QEMU exited {self.run.proc.returncode}: {err[-1] if err else 'no error output'}")

    def close(self) -> list[str]:
        """Stop what :meth:`start` began and remove what it made; one phrase per process stopped or file removed
        (``kvmtune guest run`` says them)."""
        done: list[str] = []
        if self.run is not None:
            proc = self.run.proc
            if proc is not None:
                done.append(f"stopped QEMU (pid {proc.pid})" if proc.poll() is None
                            else f"QEMU (pid {proc.pid}) had exited ({proc.returncode})")
            self.run.close()
        if self.server is not None:
            done.append(f"stopped the netload server (pid {self.server.pid})")
            self.server.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.server.wait(timeout=5)
            if self.server.poll() is None:
                self.server.kill()
                self.server.wait()
        with contextlib.suppress(OSError):
            size = self.image.stat().st_size
            self.image.unlink()
            done.append(f"removed the scratch disk {self.image} ({size / 2**30:.0f} GiB)")
        with contextlib.suppress(OSError):
            self.rundir.rmdir()
        return done
