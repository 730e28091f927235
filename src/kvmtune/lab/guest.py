"""The probe guest: a host kernel plus an initramfs kvmtune assembles.

The initramfs holds busybox (static), fio and the shared libraries it links,
optional tools (``mke2fs`` so file workloads get ext4), the kernel modules
the storage buses need (resolved through ``modules.dep``, decompressed when
the tree ships ``.ko.xz``/``.ko.gz``/``.ko.zst``), ``/init`` and any extra
binaries another component asks for (the network load generator later):
pass them as :class:`ExtraFile` entries.

Builds are cached in ``<workdir>/guest/<key>.cpio`` where ``key`` is the
SHA-256 of every input's content (file hashes are memoised by path, size,
mtime and inode, so an unchanged input is not read again). The initramfs is
left uncompressed: under TCG, unpacking is cheaper than decompressing.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import lzma
import os
import re
import shutil
import stat
import struct
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from kvmtune.errors import KvmtuneError
from kvmtune.host.root import HostRoot
from kvmtune.runner import Runner

BUILDER_VERSION = "3"

# Loaded by /init itself: what it needs to read the job the host passes.
BOOT_MODULES = ("qemu_fw_cfg",)
# What a job that starts the guest agent loads: the virtio-serial port it talks through.
AGENT_MODULES = ("virtio_pci", "virtio_console")
# Modules the storage matrix needs; a missing one is an error unless built in.
REQUIRED_MODULES = ("virtio_pci", "virtio_blk", "virtio_scsi", "sd_mod", "ata_piix", "qemu_fw_cfg")
# Nice to have: I/O schedulers for the deadline-vs-CFQ comparison, NVMe, virtio-net for netload,
# virtio_console for the guest agent's virtio-serial port.
OPTIONAL_MODULES = ("bfq", "kyber_iosched", "nvme", "virtio_net", "virtio_console")
BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")
# busybox applets the init and the job scripts use
APPLETS = (
    "mkfifo",
    "kill",
    "mv",
    "touch",
    "sh",
    "mount",
    "umount",
    "mkdir",
    "cat",
    "echo",
    "insmod",
    "poweroff",
    "sync",
    "cut",
    "sleep",
    "dd",
    "ls",
    "rm",
    "grep",
    "sed",
    "head",
    "tail",
    "mke2fs",
    "mkfs.ext2",
    "test",
    "[",
    "printf",
    "uname",
    "date",
    "wc",
    "tr",
    "awk",
    "find",
    "true",
    "false",
    "env",
    "dmesg",
    "blockdev",
    "stat",
    "ip",
    "ifconfig",
    "hostname",
)


@dataclass(frozen=True)
class ExtraFile:
    """A host file to put into the initramfs at ``dest`` (its libraries too when dynamic)."""

    src: str
    dest: str
    mode: int = 0o755


# QEMU's guest agent (Debian: qemu-guest-agent), for a probe guest whose inside kvmtune audits
GUEST_AGENT_BINARY = "/usr/sbin/qemu-ga"
GUEST_AGENT_PORT = "org.qemu.guest_agent.0"


def guest_agent_file() -> ExtraFile:
    """qemu-ga for the initramfs (its shared libraries come along, as for every dynamic extra)."""
    if not os.path.isfile(GUEST_AGENT_BINARY):
        raise KvmtuneError(f"{GUEST_AGENT_BINARY}: not installed (Debian package: qemu-guest-agent)")
    return ExtraFile(GUEST_AGENT_BINARY, "/usr/sbin/qemu-ga")


def guest_agent_job() -> str:
    """Shell lines for a probe guest's job that start qemu-ga on the agent's virtio-serial port.

    Without udev there is no /dev/virtio-ports/ link: the port is found by its name in sysfs.
    """
    return (
        'for m in $(cat /etc/kvmtune/agent-modules); do insmod "/lib/modules/$m" 2>/dev/null; done\n'
        "port=\n"
        "i=0\n"
        "while [ $i -lt 100 ]; do\n"  # at most 5 s; the port is usually there at once or within a few tries
        "  for d in /sys/class/virtio-ports/*; do\n"
        f'    [ "$(cat "$d/name" 2>/dev/null)" = {GUEST_AGENT_PORT} ] && port=/dev/${{d##*/}}\n'
        "  done\n"
        '  [ -n "$port" ] && [ -c "$port" ] && break\n'
        "  sleep 0.05; i=$((i+1))\n"
        "done\n"
        "mkdir -p /var/run /tmp/qga\n"
        'qemu-ga -m virtio-serial -p "$port" -t /tmp/qga > /tmp/qga.log 2>&1 &\n'
        'echo "KVMTUNE-AGENT-STARTED $port"\n'
    )


@dataclass(frozen=True)
class KernelInfo:
    path: Path
    release: str
    modules_dir: Path | None


@dataclass(frozen=True)
class ProbeGuest:
    kernel: Path
    initrd: Path
    key: str
    release: str
    modules: tuple[str, ...]
    missing_optional: tuple[str, ...]
    tools: tuple[str, ...]
    size: int
    cached: bool
    # guest paths below /lib/modules in load order, and each module's direct dependencies
    # the uncompressed kernel (ELF with a PVH entry) when it could be extracted: QEMU boots it
    # directly, skipping the real-mode setup and decompression (about 1.3 s under TCG here)
    vmlinux: Path | None = None
    module_paths: tuple[str, ...] = ()
    module_deps: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def modules_for(self, names: Iterable[str]) -> list[str]:
        """The module paths (load order) that ``names`` need: the modules and everything they depend on."""
        need = module_closure(self.module_deps, names)
        return [p for p in self.module_paths if _mod_name(p) in need]


# --------------------------------------------------------------------------- kernel


def _version_key(release: str) -> list[int | str]:
    return [int(p) if p.isdigit() else p for p in re.split(r"[.\-+]", release)]


def bzimage_release(data: bytes) -> str | None:
    """The kernel release from a bzImage header (``kernel_version`` field), or None."""
    if len(data) < 0x210 or data[0x202:0x206] != b"HdrS":
        return None
    ptr = int.from_bytes(data[0x20E:0x210], "little")
    if not ptr:
        return None
    start = ptr + 0x200
    text = data[start : start + 256].split(b"\0", 1)[0].decode("ascii", "replace")
    return text.split(" ", 1)[0] or None


def find_kernel(host: HostRoot, kernel: str | None = None, modules_dir: str | None = None) -> KernelInfo:
    """Pick the kernel (``--kernel`` or the newest ``/boot/vmlinuz-*``) and its module tree."""
    if kernel is None:
        candidates = [p for p in host.glob("/boot/vmlinuz-*") if not p.endswith(".old")]
        if not candidates:
            raise KvmtuneError("/boot: no vmlinuz-* kernel found; pass --kernel PATH")
        kernel_host = max(candidates, key=lambda p: _version_key(p.split("vmlinuz-", 1)[1]))
        path = Path(host.path) / kernel_host.lstrip("/")
    else:
        path = Path(kernel)
    if not path.is_file():
        raise KvmtuneError(f"{path}: kernel image not found")
    try:
        with open(path, "rb") as fh:
            head = fh.read(64 * 1024)
    except OSError as exc:
        raise KvmtuneError(f"{path}: kernel image not readable ({exc.strerror})") from None
    release = bzimage_release(head)
    if release is None:
        m = re.search(r"vmlinuz-(.+)$", path.name)
        if not m:
            raise KvmtuneError(f"{path}: not a bzImage kernel (no HdrS header) and no version in its name")
        release = m.group(1)
    if modules_dir is not None:
        mdir: Path | None = Path(modules_dir)
    else:
        host_mdir = f"/lib/modules/{release}"
        mdir = Path(host.path) / host_mdir.lstrip("/") if host.is_dir(host_mdir) else None
    if mdir is not None and not (mdir / "modules.dep").is_file():
        raise KvmtuneError(f"{mdir}: module tree has no modules.dep (run depmod {release})")
    return KernelInfo(path, release, mdir)


def has_pvh_note(data: bytes) -> bool:
    """True when ``data`` is an x86-64 ELF with a Xen PHYS32_ENTRY note (what QEMU's PVH boot needs)."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return False
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type != 4:  # PT_NOTE
            continue
        pos, end = p_offset, p_offset + p_filesz
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", data, pos)
            name = data[pos + 12 : pos + 12 + namesz].rstrip(b"\0")
            if name == b"Xen" and ntype == 18:
                return True
            pos += 12 + ((namesz + 3) & ~3) + ((descsz + 3) & ~3)
    return False


def extract_vmlinux(runner: Runner, bzimage: Path, out: Path) -> bool:
    """Write the uncompressed kernel inside ``bzimage`` to ``out``; False when that is not possible."""
    data = bzimage.read_bytes()
    if len(data) < 0x250 or data[0x202:0x206] != b"HdrS":
        return False
    setup = (data[0x1F1] or 4) + 1
    poff, plen = struct.unpack_from("<II", data, 0x248)
    payload = data[setup * 512 + poff : setup * 512 + poff + plen]
    raw: bytes | None = None
    try:
        if payload[:2] == b"\x1f\x8b":
            raw = gzip.decompress(payload)
        elif payload[:6] == b"\xfd7zXZ\x00":
            raw = lzma.decompress(payload)
        elif payload[:3] == b"\x5d\x00\x00":
            raw = lzma.decompress(payload, format=lzma.FORMAT_ALONE)
        elif payload[:3] == b"BZh":
            raw = bz2.decompress(payload)
        else:
            tool = {b"\x02\x21\x4c\x18": "lz4", b"\x28\xb5\x2f\xfd": "zstd"}.get(payload[:4])
            if tool is None or not runner.which(tool):
                return False
            with tempfile.TemporaryDirectory(prefix="kvmtune-k-") as tmp:
                src, dst = Path(tmp) / "k.in", Path(tmp) / "k.out"
                src.write_bytes(payload)
                argv = [tool, "-q", "-d", "-f", str(src)] + ([str(dst)] if tool == "lz4" else ["-o", str(dst)])
                # the payload is followed by the decompressed size, which lz4 calls trailing
                # garbage (exit 1) after writing everything: judge by the ELF written, not the exit code
                res = runner.run(argv, timeout=120)
                if res.timed_out or not dst.is_file():
                    return False
                raw = dst.read_bytes()
    except (OSError, ValueError, EOFError, lzma.LZMAError):
        return False
    if raw is None or not has_pvh_note(raw):
        return False
    part = out.with_name(f"{out.name}.tmp{os.getpid()}")
    part.write_bytes(raw)
    part.replace(out)  # atomic: another kvmtune may be booting the cached copy right now
    return True


# --------------------------------------------------------------------------- modules


def _mod_name(relpath: str) -> str:
    base = relpath.rsplit("/", 1)[-1]
    base = re.sub(r"\.ko(\.(xz|gz|zst))?$", "", base)
    return base.replace("-", "_")


def parse_modules_dep(text: str) -> dict[str, tuple[str, list[str]]]:
    """``modules.dep`` → {name: (relative path, [dependency paths])}."""
    out: dict[str, tuple[str, list[str]]] = {}
    for line in text.splitlines():
        if ":" not in line:
            continue
        path, deps = line.split(":", 1)
        path = path.strip()
        out[_mod_name(path)] = (path, deps.split())
    return out


def resolve_modules(dep_text: str, builtin_text: str, wanted: Iterable[str]) -> tuple[list[str], list[str]]:
    """Return (module paths in load order, names neither present nor built in).

    A module's dependencies come before it; each path appears once.
    """
    deps = parse_modules_dep(dep_text)
    path_to_name = {p: n for n, (p, _) in deps.items()}
    builtin = {_mod_name(line.strip()) for line in builtin_text.splitlines() if line.strip()}
    order: list[str] = []
    missing: list[str] = []

    def visit(name: str, stack: tuple[str, ...]) -> None:
        if name in stack:
            return
        entry = deps.get(name)
        if entry is None:
            if name not in builtin:
                missing.append(name)
            return
        path, dpaths = entry
        if path in order:
            return
        # modules.dep lists dependencies so that the last one loads first
        for dp in reversed(dpaths):
            visit(path_to_name.get(dp, _mod_name(dp)), (*stack, name))
        if path not in order:
            order.append(path)

    for w in wanted:
        visit(w.replace("-", "_"), ())
    return order, missing


def read_module(runner: Runner, path: Path) -> bytes:
    """A module's ELF bytes, decompressing .xz/.gz/.zst."""
    name = path.name
    if name.endswith(".ko"):
        return path.read_bytes()
    if name.endswith(".ko.xz"):
        return lzma.decompress(path.read_bytes())
    if name.endswith(".ko.gz"):
        return gzip.decompress(path.read_bytes())
    if name.endswith(".ko.zst"):
        with tempfile.TemporaryDirectory(prefix="kvmtune-zst-") as tmp:
            out = Path(tmp) / "m.ko"
            res = runner.run(["zstd", "-q", "-d", "-f", str(path), "-o", str(out)], timeout=60)
            if not res.ok:
                raise KvmtuneError(f"{path}: cannot decompress ({res.describe_failure()}); install zstd")
            return out.read_bytes()
    raise KvmtuneError(f"{path}: unknown kernel module compression")


# --------------------------------------------------------------------------- ELF libraries


def parse_ldd(text: str) -> list[str]:
    """Library paths from ``ldd`` output (the loader included), in order; [] for a static binary."""
    libs: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        m = re.match(r"^\S+ => (/\S+) \(0x", line)
        if m:
            libs.append(m.group(1))
            continue
        m = re.match(r"^(/\S+) \(0x", line)
        if m:
            libs.append(m.group(1))
    return libs


def shared_libs(runner: Runner, binary: str) -> list[str]:
    res = runner.run(["ldd", binary], timeout=30)
    if "not a dynamic executable" in res.stdout + res.stderr or "statically linked" in res.stdout:
        return []
    if not res.ok:
        raise KvmtuneError(f"{binary}: cannot list its libraries ({res.describe_failure()})")
    missing = [ln.split()[0] for ln in res.stdout.splitlines() if "=> not found" in ln]
    if missing:
        raise KvmtuneError(f"{binary}: libraries not found on this host: {', '.join(missing)}")
    return parse_ldd(res.stdout)


# --------------------------------------------------------------------------- cpio


class CpioWriter:
    """Minimal ``newc`` cpio writer (what the kernel's initramfs unpacker reads)."""

    def __init__(self, fh: object) -> None:
        self._fh = fh
        self._ino = 1
        self._seen: set[str] = set()

    def _write(self, data: bytes) -> None:
        self._fh.write(data)  # type: ignore[attr-defined]

    def _entry(self, name: str, mode: int, data: bytes, nlink: int = 1) -> None:
        name = name.lstrip("/")
        if name in self._seen:
            return
        self._seen.add(name)
        namez = name.encode() + b"\0"
        fields = [
            self._ino,
            mode,
            0,
            0,
            nlink,
            0,
            len(data),
            0,
            0,
            0,
            0,
            len(namez),
            0,
        ]
        self._ino += 1
        header = b"070701" + b"".join(f"{v:08X}".encode() for v in fields)
        self._write(header + namez)
        self._write(b"\0" * ((4 - (110 + len(namez)) % 4) % 4))
        self._write(data)
        self._write(b"\0" * ((4 - len(data) % 4) % 4))

    def directory(self, name: str) -> None:
        parts = name.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            self._entry("/".join(parts[:i]), stat.S_IFDIR | 0o755, b"", 2)

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        parent = name.strip("/").rsplit("/", 1)
        if len(parent) == 2:
            self.directory(parent[0])
        self._entry(name, stat.S_IFREG | mode, data)

    def symlink(self, name: str, target: str) -> None:
        parent = name.strip("/").rsplit("/", 1)
        if len(parent) == 2:
            self.directory(parent[0])
        self._entry(name, stat.S_IFLNK | 0o777, target.encode())

    def chardev(self, name: str, major: int, minor: int) -> None:
        name = name.lstrip("/")
        if name in self._seen:
            return
        self._seen.add(name)
        namez = name.encode() + b"\0"
        fields = [self._ino, stat.S_IFCHR | 0o600, 0, 0, 1, 0, 0, 0, 0, major, minor, len(namez), 0]
        self._ino += 1
        self._write(b"070701" + b"".join(f"{v:08X}".encode() for v in fields) + namez)
        self._write(b"\0" * ((4 - (110 + len(namez)) % 4) % 4))

    def trailer(self) -> None:
        self._entry("TRAILER!!!", 0, b"")


# --------------------------------------------------------------------------- hashing


class _HashCache:
    """Content hashes memoised by (path, size, mtime, inode) in a JSON file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.data: dict[str, str] = json.loads(path.read_text())
        except (OSError, ValueError):
            self.data = {}
        self.dirty = False

    def digest(self, file: str) -> str:
        st = os.stat(file)
        key = f"{os.path.realpath(file)}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
        if key not in self.data:
            h = hashlib.sha256()
            with open(file, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
            self.data[key] = h.hexdigest()
            self.dirty = True
        return self.data[key]

    def save(self) -> None:
        if self.dirty:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data))
            tmp.replace(self.path)


# --------------------------------------------------------------------------- builder


@dataclass
class GuestBuilder:
    workdir: Path
    runner: Runner
    host: HostRoot = field(default_factory=HostRoot)
    kernel: str | None = None
    modules_dir: str | None = None
    extra: Sequence[ExtraFile] = ()
    fio: str | None = None
    busybox: str | None = None
    with_mke2fs: bool = True
    # more modules a caller's guest needs (verify's guest tier: the drivers of the bus or NIC under test);
    # like OPTIONAL_MODULES, one the kernel lacks is listed in ProbeGuest.missing_optional
    more_modules: Sequence[str] = ()

    def _tool(self, name: str, given: str | None, candidates: Sequence[str] = ()) -> str:
        if given:
            if not os.path.isfile(given):
                raise KvmtuneError(f"{given}: {name} not found")
            return given
        for c in candidates:
            if os.path.isfile(c):
                return c
        found = self.runner.which(name)
        if not found:
            raise KvmtuneError(f"{name}: not installed (Debian package: {'busybox-static' if name == 'busybox' else name})")
        return found

    def _plan(self) -> tuple[KernelInfo, dict[str, tuple[str, int]], list[str], list[str]]:
        """Return (kernel, {guest path: (host file, mode)}, module load order, missing optional)."""
        kinfo = find_kernel(self.host, self.kernel, self.modules_dir)
        files: dict[str, tuple[str, int]] = {}
        busybox = self._tool("busybox", self.busybox, BUSYBOX_CANDIDATES)
        if shared_libs(self.runner, busybox):
            raise KvmtuneError(f"{busybox}: busybox must be statically linked (Debian package busybox-static)")
        files["/bin/busybox"] = (busybox, 0o755)
        binaries: list[tuple[str, str, int]] = [(self._tool("fio", self.fio), "/usr/bin/fio", 0o755)]
        if self.with_mke2fs:
            mke2fs = shutil.which("mke2fs") or ("/usr/sbin/mke2fs" if os.path.isfile("/usr/sbin/mke2fs") else None)
            if mke2fs:
                binaries.append((mke2fs, "/usr/sbin/mke2fs", 0o755))
        for ex in self.extra:
            if not os.path.isfile(ex.src):
                raise KvmtuneError(f"{ex.src}: extra guest file not found")
            binaries.append((ex.src, ex.dest, ex.mode))
        for src, dest, mode in binaries:
            files[dest] = (src, mode)
            if mode & 0o111:
                for lib in shared_libs(self.runner, src):
                    files.setdefault(lib, (lib, 0o755))
        modules: list[str] = []
        missing_opt: list[str] = []
        if kinfo.modules_dir is None:
            raise KvmtuneError(
                f"/lib/modules/{kinfo.release}: no module tree for kernel {kinfo.path} "
                "(install its modules or pass --modules DIR)"
            )
        dep_text = (kinfo.modules_dir / "modules.dep").read_text()
        builtin_path = kinfo.modules_dir / "modules.builtin"
        builtin_text = builtin_path.read_text() if builtin_path.is_file() else ""
        modules, missing = resolve_modules(dep_text, builtin_text, REQUIRED_MODULES)
        if missing:
            raise KvmtuneError(
                f"{kinfo.modules_dir}: kernel {kinfo.release} lacks modules the probe guest needs: {', '.join(missing)}"
            )
        opt_order, missing_opt = resolve_modules(dep_text, builtin_text, (*OPTIONAL_MODULES, *self.more_modules))
        for p in opt_order:
            if p not in modules:
                modules.append(p)
        return kinfo, files, modules, missing_opt

    def build(self, force: bool = False) -> ProbeGuest:
        cache_dir = self.workdir / "guest"
        cache_dir.mkdir(parents=True, exist_ok=True)
        kinfo, files, modules, missing_opt = self._plan()
        assert kinfo.modules_dir is not None
        parsed = parse_modules_dep((kinfo.modules_dir / "modules.dep").read_text())
        deps = {n: tuple(_mod_name(d) for d in dl) for n, (_, dl) in parsed.items()}
        hc = _HashCache(cache_dir / "hashes.json")
        init_text = _init_script(files)
        h = hashlib.sha256()
        h.update(f"builder={BUILDER_VERSION}\n".encode())
        h.update(init_text.encode())
        h.update(f"kernel={hc.digest(str(kinfo.path))}\n".encode())  # not-an-option: a hash input
        for dest in sorted(files):
            src, mode = files[dest]
            h.update(f"{dest}={hc.digest(src)}:{mode:o}\n".encode())
        for m in modules:
            h.update(f"mod {m}={hc.digest(str(kinfo.modules_dir / m))}\n".encode())
        hc.save()
        key = h.hexdigest()[:20]
        out = cache_dir / f"initrd-{key}.cpio"
        meta = cache_dir / f"initrd-{key}.json"
        tools = tuple(sorted(d for d in files if not d.startswith(("/lib", "/usr/lib"))))
        cached = out.is_file() and meta.is_file() and not force
        if not cached:
            tmp = out.with_suffix(f".tmp{os.getpid()}")
            with open(tmp, "wb") as fh:
                w = CpioWriter(fh)
                for d in ("dev", "proc", "sys", "tmp", "mnt", "etc/kvmtune", "bin", "sbin", "usr/bin", "usr/sbin"):
                    w.directory(d)
                w.chardev("dev/console", 5, 1)
                w.chardev("dev/null", 1, 3)
                w.file("init", init_text.encode(), 0o755)
                for dest in sorted(files):
                    src, mode = files[dest]
                    w.file(dest, Path(src).read_bytes(), mode)
                for applet in APPLETS:
                    w.symlink(f"bin/{applet}", "/bin/busybox")
                for m in modules:
                    data = read_module(self.runner, kinfo.modules_dir / m)
                    w.file(f"lib/modules/{_guest_mod(m)}", data)
                boot = [_guest_mod(m) for m in modules if _mod_name(m) in module_closure(deps, BOOT_MODULES)]
                w.file("etc/kvmtune/modules", ("\n".join(boot) + "\n").encode())
                agent = [_guest_mod(m) for m in modules if _mod_name(m) in module_closure(deps, AGENT_MODULES)]
                w.file("etc/kvmtune/agent-modules", ("\n".join(agent) + "\n").encode())
                w.trailer()
            tmp.replace(out)
            _prune(cache_dir, keep=f"initrd-{key}")
            meta.write_text(
                json.dumps({"kernel": str(kinfo.path), "release": kinfo.release, "modules": modules, "tools": tools}, indent=1)
            )
        kdigest = hc.digest(str(kinfo.path))[:20]
        vmlinux: Path | None = cache_dir / f"vmlinux-{kdigest}"
        nopvh = cache_dir / f"vmlinux-{kdigest}.none"
        assert vmlinux is not None
        if not vmlinux.is_file() and (nopvh.is_file() or not extract_vmlinux(self.runner, kinfo.path, vmlinux)):
            nopvh.touch()
            vmlinux = None
        return ProbeGuest(
            vmlinux=vmlinux,
            kernel=kinfo.path,
            initrd=out,
            key=key,
            release=kinfo.release,
            modules=tuple(_mod_name(m) for m in modules),
            missing_optional=tuple(missing_opt),
            tools=tools,
            size=out.stat().st_size,
            cached=cached,
            module_paths=tuple(_guest_mod(m) for m in modules),
            module_deps={_mod_name(m): deps.get(_mod_name(m), ()) for m in modules},
        )


PRUNE_AGE_S = 24 * 3600


def _prune(cache_dir: Path, keep: str) -> None:
    """Drop cached builds unused for a day (other kvmtune processes may be using recent ones)."""
    import time

    now = time.time()
    for old in cache_dir.glob("initrd-*"):
        if old.name.startswith(keep):
            continue
        try:
            if now - old.stat().st_atime > PRUNE_AGE_S and now - old.stat().st_mtime > PRUNE_AGE_S:
                old.unlink()
        except OSError:
            pass


def _guest_mod(relpath: str) -> str:
    return re.sub(r"\.(xz|gz|zst)$", "", relpath)


def module_closure(deps: Mapping[str, Sequence[str]], names: Iterable[str]) -> set[str]:
    """``names`` and every module they depend on, directly or not (names as modules.dep has them, ``-`` → ``_``)."""
    out: set[str] = set()
    todo = [n.replace("-", "_") for n in names]
    while todo:
        n = todo.pop()
        if n not in out:
            out.add(n)
            todo.extend(deps.get(n, ()))
    return out


def _init_script(files: dict[str, tuple[str, int]]) -> str:
    text = resources.files("kvmtune.lab").joinpath("guest_init.sh").read_text()
    libdirs = sorted({d.rsplit("/", 1)[0] for d in files if ".so" in d.rsplit("/", 1)[-1]})
    return text.replace("@LD_LIBRARY_PATH@", ":".join(libdirs) or "/lib")
