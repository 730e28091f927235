"""``--source blktrace``: a guest disk's requests as the host block device under it sees them, where the disk's image
is a block device (a partition, an LV, a loop device) and ``blktrace`` is installed (Debian's ``blktrace``).

``blktrace -d DEV -D DIR`` runs beside the capture's blockstats loop, stopped with SIGINT at its end; ``blkparse``
then prints each request's issue (``D``) and completion (``C``) in kvmtune's own format (:data:`FORMAT`), paired by
direction and sector. These are the requests the device saw, after the host's block layer merged or split the
guest's: the capture checks their count and bytes against QEMU's blockstats of the disk, as it checks trace events,
and refuses when another process's I/O on the device (or the host's merging) makes them disagree.

What can stop it, each said in one line: no ``blktrace``, an image that is not a block device, debugfs not mounted at
``/sys/kernel/debug`` (kvmtune does not mount it), and a kernel that refuses the trace (``kernel_lockdown(7)``
restricts blktrace's debugfs files: blktrace's own error is passed on). A blktrace killed with kvmtune (SIGKILL) leaves
the kernel's trace set up: the capture's marker names the devices and the next ``capture`` or ``doctor`` runs
``blktrace -k`` on each.

blktrace's records (the device's requests: offsets, sizes, times) go to a scratch directory beside the marker in the
capture's work directory, named after it (:func:`scratch_for`), readable by this user alone and locked (``flock``)
while the capture holds it. A capture killed with SIGKILL leaves it; the next ``capture`` or ``doctor`` removes each
such directory of this user's whose lock it can take (:func:`remove_stale_scratch`).

blkparse's output is the kernel's record of requests on a device other processes may use: parsed strictly (a line
out of :data:`LINE` is skipped and counted), bounded by ``--max-events``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvmtune.capture.trace import MAX_END, MAX_SIZE, Request
from kvmtune.errors import KvmtuneError
from kvmtune.host.root import HostReadError, HostRoot
from kvmtune.runner import Runner

BLKTRACE, BLKPARSE = "blktrace", "blkparse"
DEBUGFS = "/sys/kernel/debug"
FORMAT = "%a %T.%9t %d %S %N\\n"  # action, seconds.nanoseconds, RWBS, sector, bytes
LINE = re.compile(r"([DC]) ([0-9]{1,10})\.([0-9]{9}) ([A-Z]{1,8}) ([0-9]{1,20}) ([0-9]{1,12})")
START_S = 0.5  # how long blktrace is given to fail at start (a refused trace ends at once)
STOP_S = 10.0
BLKPARSE_S = 120.0  # blkparse of one device at most
# a device path as a disk's image or a marker names it: under /dev, no option, nothing a shell would read otherwise
_DEVICE = re.compile(r"/dev/[A-Za-z0-9_./-]{1,200}")
# what kvmtune passes to blktrace: a device node directly in /dev (only root can change what it names)
_NODE = re.compile(r"/dev/[A-Za-z0-9_.-]{1,100}")
# a capture's scratch directory as :func:`scratch_for` names it (the marker's name, ``.blktrace`` for ``.json``)
_SCRATCH = re.compile(r"capture-active-[0-9]{1,10}-[0-9a-f]{16}\.blktrace")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def block_device(path: str) -> tuple[str, str]:
    """``path`` (a disk's image as QEMU names it, or a marker's device) as the device node blktrace is given:
    ``(node, "")``, or ``("", why)`` when it is not a block device kvmtune may name on blktrace's command line.

    The node is the path resolved once, a block device directly in ``/dev`` (``/dev/dm-0`` for ``/dev/vg/lv``,
    ``/dev/sdb`` for ``/dev/disk/by-id/…``), reached only through directories no one but root can change: a link in
    ``/dev/shm`` (or any directory others can write) could be turned to another device, a FIFO or a watchdog
    between the check and blktrace's ``open``, so such a path is refused, and the resolved node is what blktrace
    opens."""
    if not _DEVICE.fullmatch(path) or "/../" in path or path.endswith("/.."):
        return "", f"its image {path[:120]!r} is not a block device under /dev"
    parent = os.path.dirname(path)
    while parent != "/":
        try:
            st = os.stat(parent)
        except OSError as exc:
            return "", f"its image {path} cannot be looked at ({exc.strerror})"
        if st.st_uid != 0 or st.st_mode & 0o022:
            return "", f"its image {path} is reached through {parent}, which users other than root can change"
        parent = os.path.dirname(parent)
    node = os.path.realpath(path)
    if not _NODE.fullmatch(node):
        return "", f"its image {path} resolves to {node[:120]!r}, not a device node in /dev"
    try:
        st = os.lstat(node)
    except OSError as exc:
        return "", f"its image {path} cannot be looked at ({exc.strerror})"
    if not stat.S_ISBLK(st.st_mode):
        return "", f"its image {path} is not a block device"
    return node, ""


def held_by(host: HostRoot, pid: int, node: str) -> bool:
    """Whether the process ``pid`` holds the block device ``node`` open (one of its ``/proc/PID/fd`` is that device,
    by device number): a QEMU's QMP reply names its image, and a QEMU another user runs answers its own QMP, so the
    name alone would let that user have root trace any block device (the host's own disk)."""
    try:
        want = os.stat(node).st_rdev
    except OSError:
        return False
    for fd in host.listdir(f"/proc/{pid}/fd"):
        try:  # stat follows the fd's magic link to the open file itself
            st = os.stat(host.beneath(f"/proc/{pid}/fd/{fd}"))
        except (OSError, HostReadError):
            continue
        if stat.S_ISBLK(st.st_mode) and st.st_rdev == want:
            return True
    return False


def trace_name(device: str) -> str:
    """The name blktrace gives a device's output files: the kernel's name of the device (``dm-0`` for
    ``/dev/mapper/vg-lv``), the base name of the path it resolves to."""
    return os.path.basename(os.path.realpath(device))


def debugfs_mounted(host: HostRoot) -> bool:
    """Whether ``/proc/mounts`` (through the host root) has debugfs at :data:`DEBUGFS`."""
    try:
        text = host.read_text("/proc/mounts")
    except HostReadError:
        return False
    return any(len(f := line.split()) >= 3 and f[1] == DEBUGFS and f[2] == "debugfs" for line in text.splitlines())


def parse(text: str, max_events: int) -> tuple[list[Request], int, int]:
    """blkparse's lines in :data:`FORMAT`: (requests issued and completed, in issue order; lines skipped; flushes
    without data). An issue is paired with the next completion of the same direction and sector; an issue without a
    completion keeps ``t_done`` None."""
    return parse_lines(text.splitlines(), max_events)


def parse_lines(lines: Iterable[str], max_events: int) -> tuple[list[Request], int, int]:
    """:func:`parse` of lines as they come (blkparse's output is read as it is printed, never held whole: a busy
    device's hour is millions of lines; what is kept is at most ``max_events`` requests)."""
    pending: dict[tuple[bool, int], list[int]] = {}
    out: list[Request] = []
    skipped = flushes = 0
    for line in lines:
        m = LINE.fullmatch(line.strip())
        if m is None:
            skipped += line.strip() != ""
            continue
        action, sec, ns, rwbs, sector, size = m.groups()
        t = int(sec) + int(ns) / 1e9
        write, read = "W" in rwbs, "R" in rwbs
        if write == read:  # a flush without data (FN), a discard (D…), or nonsense: no request of the workload's
            flushes += action == "D" and "F" in rwbs and not write and not read
            continue
        key = (write, int(sector))
        if int(size) > MAX_SIZE or int(sector) * 512 + int(size) > MAX_END:  # as a trace event's bounds
            skipped += 1
            continue
        if action == "D":
            if len(out) >= max_events:
                continue
            pending.setdefault(key, []).append(len(out))
            out.append(Request(t, None, 0, write, int(sector) * 512, int(size)))
        elif pending.get(key):
            i = pending[key].pop(0)
            r = out[i]
            if t >= r.t_submit:
                out[i] = Request(r.t_submit, t, r.vdev, r.write, r.offset, r.size)
    return out, skipped, flushes


@dataclass
class BlkTrace:
    """One blktrace run over some block devices, its output in a private scratch directory."""

    host: HostRoot
    runner: Runner
    devices: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    scratch: Path | None = None
    _lock: int = -1  # the scratch directory, open and flock()ed

    def why_not(self) -> str:
        if self.runner.which(BLKTRACE) is None or self.runner.which(BLKPARSE) is None:
            return "blktrace and blkparse are not installed (Debian: apt install blktrace)"
        if not debugfs_mounted(self.host):
            return f"debugfs is not mounted at {DEBUGFS} (blktrace needs it; kvmtune does not mount it)"
        return ""

    def start(self, devices: Sequence[str], scratch: Path) -> None:
        """Start tracing ``devices`` (each checked by :func:`block_device` by the caller) into the new directory
        ``scratch`` (:func:`scratch_for` the capture's marker); raises with blktrace's own reason when it ends at
        once (a kernel that refuses the trace)."""
        self.devices = list(devices)
        try:
            os.mkdir(scratch, 0o700)  # new: never one someone prepared
            self._lock = os.open(scratch, _DIR_FLAGS)
        except OSError as exc:
            raise KvmtuneError(f"{scratch}: cannot create blktrace's scratch directory ({exc.strerror})") from None
        fcntl.flock(self._lock, fcntl.LOCK_EX)  # held while this capture lives: not a leftover
        self.scratch = scratch
        argv = [BLKTRACE, *(a for d in self.devices for a in ("-d", d)), "-D", str(self.scratch)]
        self.proc = self.runner.popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(START_S)
        if self.proc.poll() is not None:
            err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
            self.proc = None
            self.cleanup()
            last = next((x for x in reversed(err.strip().splitlines()) if x.strip()), f"exit {os.EX_SOFTWARE}")
            hint = " (kernel_lockdown(7) restricts blktrace's debugfs files)" if "not permitted" in err else ""
            raise KvmtuneError(f"blktrace could not trace {', '.join(self.devices)}: {last.strip()[:200]}{hint}")

    def halt(self) -> str:
        """Stop tracing (SIGINT: blktrace tears the kernel's trace down itself); a note when it had to be killed."""
        if self.proc is None:
            return ""
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=STOP_S)
            return ""
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return "blktrace did not stop on SIGINT; killed (its kernel trace may be left: blktrace -k)"
        finally:
            self.proc = None

    def read(self, max_events: int) -> tuple[dict[str, list[Request]], list[str]]:
        """Each traced device's requests once halted: (per device, notes); the scratch directory removed."""
        notes: list[str] = []
        out: dict[str, list[Request]] = {}
        if self.scratch is None:
            return out, notes
        try:
            for dev in self.devices:
                reqs, skipped = self._blkparse(dev, max_events)
                if skipped:
                    notes.append(f"{skipped} blkparse line(s) of {dev} out of format; skipped")
                out[dev] = reqs
        finally:
            self.cleanup()
        return out, notes

    def _blkparse(self, dev: str, max_events: int) -> tuple[list[Request], int]:
        """One device's records through ``blkparse``, its lines parsed as they come (each at most 256 bytes: a longer
        one is split, and its pieces out of format), killed after :data:`BLKPARSE_S`; its errors kept in the scratch
        directory (a pipe nobody reads could stall it)."""
        assert self.scratch is not None
        err_path = self.scratch / "blkparse.err"
        with open(err_path, "xb") as err:
            proc = self.runner.popen([BLKPARSE, "-i", trace_name(dev), "-D", str(self.scratch), "-q", "-f", FORMAT,
                                      "-a", "issue", "-a", "complete"], stdout=subprocess.PIPE, stderr=err)
        timer = threading.Timer(BLKPARSE_S, proc.kill)
        timer.start()
        try:
            assert proc.stdout is not None
            lines = (raw.decode("ascii", "replace") for raw in iter(lambda: proc.stdout.readline(256), b""))  # type: ignore[union-attr]
            reqs, skipped, _ = parse_lines(lines, max_events)
        finally:
            timer.cancel()
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        if proc.returncode != 0:
            text = err_path.read_bytes()[-4096:].decode("utf-8", "replace").strip()
            last = text.splitlines()[-1] if text else ""
            why = f"killed after {BLKPARSE_S:g} s" if proc.returncode == -signal.SIGKILL else f"exit {proc.returncode}"
            raise KvmtuneError(f"blkparse of {dev}: {why}" + (f": {last[:200]}" if last else ""))
        err_path.unlink()
        return reqs, skipped

    def cleanup(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
        if self.scratch is not None:
            _empty(self._lock)
            with contextlib.suppress(OSError):
                os.rmdir(self.scratch)
            os.close(self._lock)
            self._lock, self.scratch = -1, None


def scratch_for(marker: Path) -> Path:
    """Where the capture that wrote ``marker`` keeps blktrace's records: beside it, named after it."""
    return marker.with_suffix(".blktrace")


def _empty(dir_fd: int) -> None:
    """Remove what blktrace and blkparse wrote in the open directory ``dir_fd`` (names, never followed)."""
    for name in os.listdir(dir_fd):
        with contextlib.suppress(IsADirectoryError, PermissionError, FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)


def remove_stale_scratch(workdir: Path) -> list[str]:
    """Remove the scratch directories killed captures left in ``workdir``: only this user's own directories (not a
    link, no one else may write them) whose lock no capture holds; one line for each removed or left."""
    out: list[str] = []
    with contextlib.suppress(OSError):
        names = sorted(os.listdir(workdir))
        for name in names:
            if not _SCRATCH.fullmatch(name):
                continue
            path = workdir / name
            try:
                fd = os.open(path, _DIR_FLAGS | os.O_NONBLOCK)
            except OSError:
                out.append(f"{path}: not a blktrace scratch directory of this user; left alone")
                continue
            try:
                st = os.fstat(fd)
                if st.st_uid != os.geteuid() or st.st_mode & 0o022:
                    out.append(f"{path}: not a blktrace scratch directory of this user; left alone")
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a running capture's
                _empty(fd)
                try:
                    os.rmdir(path)
                    out.append(f"{path}: blktrace records of a killed capture removed")
                except OSError as exc:
                    out.append(f"{path}: blktrace records of a killed capture: cannot remove ({exc.strerror})")
            finally:
                os.close(fd)
    return out


def teardown(runner: Runner, device: str) -> str:
    """After a killed capture: ``blktrace -k -d DEV`` tears the kernel's trace of ``device`` down; one line."""
    node, why = block_device(device)
    if why:
        return f"blktrace device {device[:120]!r} in the marker: {why.removeprefix('its image ')}; left alone"
    res = runner.run([BLKTRACE, "-k", "-d", node], timeout=30)
    return f"blktrace of {node} torn down" if res.ok else f"blktrace -k of {node}: {res.describe_failure()}"
