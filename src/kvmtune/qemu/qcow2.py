"""A small read-only qcow2 reader: the header, and guest data through the L1/L2 tables.

kvmtune reads the first sectors of a guest disk (its partition table) itself
rather than through ``qemu-io`` or ``qemu-img dd``: it takes a few
milliseconds, needs no external program and works on images a running QEMU
holds locked. Supported: qcow2 v2/v3, zero clusters, extended L2 entries
(subclusters), zlib-compressed clusters, backing files (raw or qcow2) and raw
external data files. Encrypted images and zstd-compressed clusters are
reported as unreadable, never guessed.

Format reference: QEMU ``docs/interop/qcow2.txt``.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from typing import BinaryIO, Protocol

QCOW2_MAGIC = b"QFI\xfb"
OFFSET_MASK = 0x00FF_FFFF_FFFF_FE00  # bits 9-55 of L1 and standard L2 entries
L2E_COMPRESSED = 1 << 62
L2E_ZERO = 1  # bit 0 of a standard L2 entry (v3)
EXT_BACKING_FORMAT = 0xE2792ACA
EXT_DATA_FILE = 0x44415441
MAX_CHAIN = 16

# Magic numbers of formats the reader does not open (for a clear message).
OTHER_MAGICS = {
    b"KDMV": "vmdk",
    b"conectix": "vpc",
    b"vhdxfile": "vhdx",
    b"QFI\xfb": "qcow2",
    b"<<< ": "vdi",
    b"QED\x00": "qed",
    b"LUKS\xba\xbe": "luks",
}


class Qcow2Error(Exception):
    """The image cannot be read the way we need; ``str()`` is one line."""


@dataclass(frozen=True)
class Qcow2Header:
    version: int
    backing_file_offset: int
    backing_file_size: int
    cluster_bits: int
    size: int
    crypt_method: int
    l1_size: int
    l1_table_offset: int
    refcount_table_offset: int
    refcount_table_clusters: int
    nb_snapshots: int
    snapshots_offset: int
    incompatible_features: int = 0
    compatible_features: int = 0
    autoclear_features: int = 0
    refcount_order: int = 4
    header_length: int = 72
    compression_type: int = 0
    backing_file: str | None = None
    backing_format: str | None = None
    data_file: str | None = None

    @property
    def cluster_size(self) -> int:
        return 1 << self.cluster_bits

    @property
    def dirty(self) -> bool:
        return bool(self.incompatible_features & 1)

    @property
    def corrupt(self) -> bool:
        return bool(self.incompatible_features & 2)

    @property
    def external_data_file(self) -> bool:
        return bool(self.incompatible_features & 4)

    @property
    def extended_l2(self) -> bool:
        return bool(self.incompatible_features & 16)

    @property
    def lazy_refcounts(self) -> bool:
        return bool(self.compatible_features & 1)

    @property
    def l2_entry_size(self) -> int:
        return 16 if self.extended_l2 else 8

    @property
    def l2_entries(self) -> int:
        return self.cluster_size // self.l2_entry_size

    @property
    def compat(self) -> str:
        return "0.10" if self.version == 2 else "1.1"

    def l1_entries_needed(self) -> int:
        per_l2 = self.l2_entries * self.cluster_size
        return (self.size + per_l2 - 1) // per_l2


def parse_qcow2_header(data: bytes) -> Qcow2Header:
    """Parse the header (and its extensions) from the image's first cluster. Pure."""
    if len(data) < 72:
        raise Qcow2Error(f"header is {len(data)} bytes, a qcow2 header needs at least 72 (truncated?)")
    if data[:4] != QCOW2_MAGIC:
        raise Qcow2Error("no qcow2 magic (QFI\\xfb) at offset 0")
    (version, bfo, bfs, cbits, size, crypt, l1_size, l1_off, rc_off, rc_clusters, nb_snap, snap_off) = struct.unpack(
        ">IQIIQIIQQIIQ", data[4:72]
    )
    if version not in (2, 3):
        raise Qcow2Error(f"qcow2 version {version} (only 2 and 3 exist)")
    if not 9 <= cbits <= 21:
        raise Qcow2Error(f"cluster_bits {cbits} out of range 9..21 (corrupt header)")
    fields: dict[str, object] = {}
    header_length = 72
    if version == 3:
        if len(data) < 104:
            raise Qcow2Error("v3 header shorter than 104 bytes (truncated?)")
        incompat, compat, autoclear, rc_order, header_length = struct.unpack(">QQQII", data[72:104])
        fields.update(
            incompatible_features=incompat, compatible_features=compat, autoclear_features=autoclear,
            refcount_order=rc_order,
        )
        if header_length > 104 and len(data) > 104:
            fields["compression_type"] = data[104]
    fields["header_length"] = header_length
    # header extensions
    pos = (header_length + 7) & ~7 if version == 3 else 72
    for _ in range(64):
        if pos + 8 > len(data):
            break
        ext_type, ext_len = struct.unpack(">II", data[pos : pos + 8])
        if ext_type == 0:
            break
        payload = data[pos + 8 : pos + 8 + ext_len]
        if ext_type == EXT_BACKING_FORMAT:
            fields["backing_format"] = payload.decode("utf-8", "replace")
        elif ext_type == EXT_DATA_FILE:
            fields["data_file"] = payload.decode("utf-8", "replace")
        pos += 8 + ((ext_len + 7) & ~7)
    if bfo and bfs:
        if bfo + bfs > len(data):
            raise Qcow2Error("backing file name lies beyond the header cluster (corrupt header)")
        fields["backing_file"] = data[bfo : bfo + bfs].decode("utf-8", "replace")
    return Qcow2Header(
        version, bfo, bfs, cbits, size, crypt, l1_size, l1_off, rc_off, rc_clusters, nb_snap, snap_off,
        **fields,  # type: ignore[arg-type]
    )


class GuestReader(Protocol):
    """Reads the guest-visible bytes of a disk image."""

    size: int

    def read(self, offset: int, length: int) -> bytes: ...

    def close(self) -> None: ...


def _pread(fh: BinaryIO, offset: int, length: int) -> bytes:
    return os.pread(fh.fileno(), length, offset)


class RawReader:
    def __init__(self, path: str) -> None:
        self.path = path
        self.fh: BinaryIO = open(path, "rb")  # noqa: SIM115 - closed by close()
        self.size = os.lseek(self.fh.fileno(), 0, os.SEEK_END)

    def read(self, offset: int, length: int) -> bytes:
        if offset >= self.size:
            return b"\0" * length
        data = _pread(self.fh, offset, min(length, self.size - offset))
        return data + b"\0" * (length - len(data))

    def close(self) -> None:
        self.fh.close()


class Qcow2Reader:
    """Guest reads through the L1/L2 tables of one qcow2 image (and its backing chain)."""

    def __init__(self, path: str, header: Qcow2Header, backing: GuestReader | None, data: GuestReader | None) -> None:
        self.path = path
        self.header = header
        self.size = header.size
        self.backing = backing
        self.data = data  # raw external data file, when the image has one
        self.fh: BinaryIO = open(path, "rb")  # noqa: SIM115 - closed by close()
        self.file_size = os.fstat(self.fh.fileno()).st_size
        self._l1: list[int] | None = None
        self._l2: dict[int, bytes] = {}

    def close(self) -> None:
        self.fh.close()
        if self.backing is not None:
            self.backing.close()
        if self.data is not None:
            self.data.close()

    def _host_read(self, offset: int, length: int, what: str) -> bytes:
        if offset + length > self.file_size:
            raise Qcow2Error(
                f"{what} at offset {offset} lies beyond the end of the file ({self.file_size} bytes): truncated"
            )
        return _pread(self.fh, offset, length)

    def l1_table(self) -> list[int]:
        if self._l1 is None:
            h = self.header
            if h.l1_size < h.l1_entries_needed():
                raise Qcow2Error(f"L1 table has {h.l1_size} entries, the virtual size needs {h.l1_entries_needed()}")
            raw = self._host_read(h.l1_table_offset, h.l1_size * 8, "L1 table")
            self._l1 = list(struct.unpack(f">{h.l1_size}Q", raw))
        return self._l1

    def _l2_table(self, offset: int) -> bytes:
        if offset not in self._l2:
            self._l2[offset] = self._host_read(offset, self.header.cluster_size, "L2 table")
        return self._l2[offset]

    def _fallback(self, offset: int, length: int) -> bytes:
        if self.backing is not None:
            return self.backing.read(offset, length)
        return b"\0" * length

    def _decompress(self, entry: int) -> bytes:
        h = self.header
        x = 62 - (h.cluster_bits - 8)
        host = entry & ((1 << x) - 1)
        sectors = ((entry >> x) & ((1 << (h.cluster_bits - 8)) - 1)) + 1
        raw = self._host_read(host, min(sectors * 512 - (host & 511), self.file_size - host), "compressed cluster")
        if h.compression_type == 0:
            try:
                return zlib.decompressobj(-12).decompress(raw, h.cluster_size).ljust(h.cluster_size, b"\0")
            except zlib.error as exc:
                raise Qcow2Error(f"compressed cluster at offset {host} does not inflate: {exc}") from None
        raise Qcow2Error("cluster compressed with zstd, which this reader does not decode")

    def read(self, offset: int, length: int) -> bytes:
        h = self.header
        if h.crypt_method:
            raise Qcow2Error("image is encrypted")
        out = bytearray()
        end = min(offset + length, self.size)
        pos = offset
        while pos < end:
            cluster = pos >> h.cluster_bits
            in_cluster = pos & (h.cluster_size - 1)
            n = min(end - pos, h.cluster_size - in_cluster)
            out += self._read_in_cluster(cluster, in_cluster, pos, n)
            pos += n
        return bytes(out) + b"\0" * (length - len(out))

    def _read_in_cluster(self, cluster: int, in_cluster: int, guest_off: int, n: int) -> bytes:
        h = self.header
        if h.external_data_file and self.data is not None and not h.extended_l2:
            return self.data.read(guest_off, n)
        l1 = self.l1_table()
        l1_idx, l2_idx = divmod(cluster, h.l2_entries)
        l2_off = l1[l1_idx] & OFFSET_MASK
        if l2_off == 0:
            return self._fallback(guest_off, n)
        table = self._l2_table(l2_off)
        es = h.l2_entry_size
        entry = struct.unpack(">Q", table[l2_idx * es : l2_idx * es + 8])[0]
        if entry & L2E_COMPRESSED:
            return self._decompress(entry)[in_cluster : in_cluster + n]
        host = entry & OFFSET_MASK
        if h.extended_l2:
            bitmap = struct.unpack(">Q", table[l2_idx * es + 8 : l2_idx * es + 16])[0]
            sub = h.cluster_size // 32
            out = bytearray()
            pos = in_cluster
            while pos < in_cluster + n:
                sc = pos // sub
                m = min(in_cluster + n - pos, (sc + 1) * sub - pos)
                if bitmap >> sc & 1:
                    out += self._host_read(host + pos, m, "data cluster")
                elif bitmap >> (32 + sc) & 1:
                    out += b"\0" * m
                else:
                    out += self._fallback(guest_off + (pos - in_cluster), m)
                pos += m
            return bytes(out)
        if entry & L2E_ZERO and h.version == 3:
            return b"\0" * n
        if host == 0:
            return self._fallback(guest_off, n)
        return self._host_read(host + in_cluster, n, "data cluster")

    def l1_allocated(self) -> tuple[int, int]:
        """(allocated L1 entries, entries the virtual size needs)."""
        need = self.header.l1_entries_needed()
        l1 = self.l1_table()[:need]
        return sum(1 for e in l1 if e & OFFSET_MASK), need

    def sample_l2_allocated(self, tables: int = 4) -> tuple[int, int]:
        """(allocated, total) L2 entries over the first few L2 tables the image has."""
        h = self.header
        clusters = (h.size + h.cluster_size - 1) // h.cluster_size
        allocated = total = 0
        for l1_idx, e in enumerate(self.l1_table()):
            off = e & OFFSET_MASK
            if not off:
                continue
            table = self._l2_table(off)
            for i in range(min(h.l2_entries, clusters - l1_idx * h.l2_entries)):
                entry = struct.unpack(">Q", table[i * h.l2_entry_size : i * h.l2_entry_size + 8])[0]
                total += 1
                if entry & OFFSET_MASK or entry & L2E_COMPRESSED:
                    allocated += 1
            tables -= 1
            if tables == 0:
                break
        return allocated, total


def read_header(path: str) -> Qcow2Header:
    with open(path, "rb") as fh:
        data = fh.read(2 * 1024 * 1024)
    return parse_qcow2_header(data)


def probe_format(path: str) -> str:
    """``qcow2``, another known format name, or ``raw`` (no recognised magic)."""
    with open(path, "rb") as fh:
        head = fh.read(64)
    for magic, name in OTHER_MAGICS.items():
        if head.startswith(magic):
            return name
    return "raw"


def open_guest_reader(path: str, fmt: str | None = None, _depth: int = 0) -> GuestReader:
    """A reader of the guest-visible bytes of a raw or qcow2 image, following backing files."""
    if _depth > MAX_CHAIN:
        raise Qcow2Error(f"backing chain longer than {MAX_CHAIN} (loop?)")
    fmt = fmt or probe_format(path)
    if fmt in ("raw", "host_device", "file"):
        return RawReader(path)
    if fmt != "qcow2":
        raise Qcow2Error(f"format {fmt} is not read by kvmtune's partition reader")
    header = read_header(path)
    if header.crypt_method:
        raise Qcow2Error("image is encrypted")
    base_dir = os.path.dirname(os.path.abspath(path))
    backing: GuestReader | None = None
    if header.backing_file:
        bpath = header.backing_file
        if "://" in bpath or bpath.startswith("json:"):
            raise Qcow2Error(f"backing file {bpath} is not a local file")
        bpath = bpath if os.path.isabs(bpath) else os.path.join(base_dir, bpath)
        if not os.path.exists(bpath):
            raise Qcow2Error(f"backing file {bpath} does not exist")
        backing = open_guest_reader(bpath, header.backing_format, _depth + 1)
    data: GuestReader | None = None
    if header.external_data_file and header.data_file:
        dpath = header.data_file if os.path.isabs(header.data_file) else os.path.join(base_dir, header.data_file)
        data = RawReader(dpath)
    return Qcow2Reader(path, header, backing, data)
