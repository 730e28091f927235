"""QEMU's block graph as a command line describes it, resolved per guest disk.

A guest device names a node (``drive=``). QEMU accepts that node in every form below, and
real generators use all of them:

* ``-blockdev`` as JSON or as dotted keys (``file.driver=file,file.filename=...``);
* children given by node-name (libvirt: ``"file":"libvirt-1-storage"``) or inline
  (Proxmox VE: ``"file":{"driver":"qcow2","file":{"driver":"file",...}}``);
* filter nodes between the device and the image (throttle, copy-on-read, preallocate,
  compress, blkdebug, ...);
* ``-drive`` with ``format=``/``driver=``, ``file=`` as a path, a protocol string
  (``rbd:pool/img``, ``nbd:host:port``, ``iscsi://...``) or ``json:{...}``, and ``file.*`` keys.

:func:`resolve` walks from the device's node through the filters to the format node and
the protocol node and works out what QEMU runs with: the protocol node's effective
``cache.direct``/``cache.no-flush`` (inline children inherit them from their parent, as in
QEMU's ``bdrv_inherited_options``), ``aio``, and ``discard``. The device's ``write-cache``
completes the cache mode in :func:`kvmtune.model.values.cache_mode`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kvmtune.model.values import CACHE_MODES, DISCARD_PASSES, SOURCE_TYPE_OF_PROTOCOL, qemu_bool

FORMAT_DRIVERS = frozenset(
    {"raw", "qcow2", "qcow", "qed", "vmdk", "vdi", "vpc", "vhdx", "luks", "parallels", "bochs", "dmg", "cloop",
     "vvfat"}
)
# drivers that pass I/O on to one child unchanged in meaning (QEMU's "filter" drivers), with that child's role
FILTER_CHILD = {
    "throttle": "file", "copy-on-read": "file", "preallocate": "file", "compress": "file", "blkdebug": "image",
    "blklogwrites": "file", "blkverify": "test", "copy-before-write": "file", "snapshot-access": "file",
    "zeroinit": "file", "alloc-track": "file", "replication": "file",
}
NETWORK_PROTOCOLS = frozenset(
    {"rbd", "iscsi", "nbd", "gluster", "nfs", "ssh", "http", "https", "ftp", "ftps", "sheepdog", "vxhs", "curl",
     "vitastor"}
)
# -drive file= strings that name a protocol instead of a path (QEMU's protocol prefixes)
_URL_PROTOCOLS = (
    ("nbd+unix://", "nbd"), ("nbd+tcp://", "nbd"), ("nbd://", "nbd"), ("nbd:", "nbd"), ("rbd:", "rbd"),
    ("iscsi://", "iscsi"), ("gluster+tcp://", "gluster"), ("gluster+unix://", "gluster"),
    ("gluster+rdma://", "gluster"), ("gluster://", "gluster"), ("nfs://", "nfs"), ("ssh://", "ssh"),
    ("https://", "https"), ("http://", "http"), ("ftps://", "ftps"), ("ftp://", "ftp"),
    ("sheepdog:", "sheepdog"), ("host_device:", "host_device"), ("file:", "file"),
)
def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"file.driver": "file", "cache.direct": "on"}`` -> nested dicts, as QEMU's keyval parser builds them."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        if isinstance(value, dict):
            continue  # the flattened copy of a JSON object: its dotted keys carry the same values
        parts = key.split(".")
        cur = out
        for part in parts[:-1]:
            nxt = cur.get(part)
            if not isinstance(nxt, dict):
                nxt = cur[part] = {}
            cur = nxt
        leaf = parts[-1]
        if not isinstance(cur.get(leaf), dict):  # "file=x" next to "file.y=z": the inline child wins
            cur[leaf] = value
    return out


def _get(opts: dict[str, Any], dotted: str) -> Any:
    cur: Any = opts
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


@dataclass
class BlockNode:
    """One node of the block graph with the options it was opened with (inherited ones included)."""

    name: str
    driver: str
    opts: dict[str, Any]
    where: str  # the command-line option that describes it
    inline: bool = False
    children: dict[str, BlockNode | str] = field(default_factory=dict)  # role -> node or node-name

    @property
    def direct(self) -> bool | None:
        return qemu_bool(_get(self.opts, "cache.direct"))

    @property
    def no_flush(self) -> bool | None:
        return qemu_bool(_get(self.opts, "cache.no-flush"))


@dataclass
class ResolvedDisk:
    """What one guest device's I/O goes through."""

    protocol: str | None = None  # file, host_device, rbd, iscsi, nbd, ...
    path: str | None = None  # file name, device, or pool/image, host:port/export
    source_type: str | None = None  # file | block | network | nvme | ...
    format: str | None = None  # qcow2, raw, ...; None: QEMU probes it
    direct: bool | None = None
    no_flush: bool | None = None
    aio: str | None = None
    discard: bool = False
    detect_zeroes: str | None = None
    read_only: bool = False
    filters: list[str] = field(default_factory=list)
    where: str = ""  # the option of the protocol node (or of the top node)
    wce_default: bool | None = None  # a -drive's cache mode sets the device's write cache unless write-cache= does


def _children_of(node_opts: dict[str, Any], driver: str) -> dict[str, Any]:
    roles = {FILTER_CHILD[driver]} if driver in FILTER_CHILD else {"file"}
    return {r: node_opts[r] for r in roles if r in node_opts}


class BlockGraph:
    """All nodes of one command line, by node-name (inline children included)."""

    def __init__(self) -> None:
        self.nodes: dict[str, BlockNode] = {}
        self._anon = 0

    def add_tree(self, opts: dict[str, Any], where: str, *, inline: bool = False) -> BlockNode:
        """Register a node given as nested options, and its inline children (which inherit cache options)."""
        driver = str(opts.get("driver", "")).lower()
        name = str(opts.get("node-name") or "")
        if not name:
            self._anon += 1
            name = f"#{where}#{self._anon}"
        node = BlockNode(name=name, driver=driver, opts=opts, where=where, inline=inline)
        self.nodes.setdefault(name, node)
        for role, child in _children_of(opts, driver).items():
            if isinstance(child, dict):
                child = dict(child)
                for key in ("direct", "no-flush"):  # QEMU: an inline child inherits unset cache options
                    parent_val = _get(opts, f"cache.{key}")
                    if parent_val is not None and _get(child, f"cache.{key}") is None:
                        cache = dict(child.get("cache") or {}) if isinstance(child.get("cache"), dict) else {}
                        cache[key] = parent_val
                        child["cache"] = cache
                for key in ("read-only", "aio"):
                    if key in opts and key not in child:
                        child[key] = opts[key]
                if "discard" not in child:
                    # children of a format node default to unmap; a filter's child takes its parent's policy
                    if driver in FORMAT_DRIVERS:
                        child["discard"] = "unmap"
                    elif "discard" in opts:
                        child["discard"] = opts["discard"]
                node.children[role] = self.add_tree(child, where, inline=True)
            elif isinstance(child, str) and child:
                node.children[role] = child
        return node

    def child(self, node: BlockNode, role: str) -> BlockNode | None:
        c = node.children.get(role)
        if isinstance(c, BlockNode):
            return c
        if isinstance(c, str):
            return self.nodes.get(c)
        return None

    def resolve(self, name: str) -> ResolvedDisk | None:
        top = self.nodes.get(name)
        if top is None:
            return None
        out = ResolvedDisk(where=top.where)
        node: BlockNode | None = top
        fmt: BlockNode | None = None
        proto: BlockNode | None = None
        seen: set[str] = set()
        while node is not None and node.name not in seen:
            seen.add(node.name)
            if node.driver in FILTER_CHILD:
                out.filters.append(node.driver)
                node = self.child(node, FILTER_CHILD[node.driver])
                continue
            if node.driver in FORMAT_DRIVERS and (fmt is None or node.driver == "raw"):
                if fmt is None:
                    fmt = node
                else:
                    out.filters.append("raw-slice")  # libvirt's <slice>: a raw node with offset/size below
                nxt = self.child(node, "file")
                if nxt is None:
                    break
                node = nxt
                continue
            proto = node
            break
        if fmt is not None:
            out.format = fmt.driver
        elif proto is not None and not proto.opts.get("x-format-probed"):
            out.format = "raw"  # a device on a protocol node reads it as raw
        policy_nodes = [n for n in (fmt, proto) if n is not None]
        # guest discards reach the storage only if the format node and the protocol node below it pass them on
        out.discard = bool(policy_nodes) and all(
            str(n.opts.get("discard", "ignore")).lower() in DISCARD_PASSES for n in policy_nodes
        )
        upper = fmt or proto
        if upper is not None and "detect-zeroes" in upper.opts:
            out.detect_zeroes = str(upper.opts["detect-zeroes"])
        out.read_only = any(qemu_bool(n.opts.get("read-only")) for n in (top, *policy_nodes))
        if proto is not None:
            out.protocol = proto.driver
            out.source_type = SOURCE_TYPE_OF_PROTOCOL.get(proto.driver, "network")  # any other protocol is a network one
            out.path = protocol_path(proto.driver, proto.opts)
            out.direct, out.no_flush = proto.direct, proto.no_flush
            if fmt is not None:  # O_DIRECT is the protocol node's, but a flush stops at the first no-flush node
                out.no_flush = bool(proto.no_flush) or bool(fmt.no_flush) if (
                    proto.no_flush is not None or fmt.no_flush is not None) else None
            aio = proto.opts.get("aio")
            out.aio = str(aio).lower() if aio is not None else None
            out.where = proto.where
        elif fmt is not None:
            out.direct, out.no_flush = fmt.direct, fmt.no_flush
        return out


def protocol_path(driver: str, opts: dict[str, Any]) -> str | None:
    """A readable location for a protocol node: a path, pool/image, host:port/export or a URL."""
    if driver in NETWORK_PROTOCOLS and opts.get("filename"):
        return str(opts["filename"])  # a legacy protocol string, already reduced by legacy_location
    if driver in ("file", "host_device", "host_cdrom", "nvme-io_uring", "io_uring"):
        return _str(opts.get("filename") or opts.get("path"))
    if driver == "rbd":
        pool, image = opts.get("pool"), opts.get("image")
        ns = opts.get("namespace")
        return "/".join(str(p) for p in (pool, ns, image) if p) or None
    if driver == "nbd":
        server = _dict(opts.get("server"))
        export = opts.get("export")
        if server.get("type") == "unix" or "path" in server:
            base = f"unix:{server.get('path', '')}"
        else:
            base = f"{server.get('host', '')}:{server.get('port', 10809)}"
        return f"{base}/{export}" if export else base
    if driver == "iscsi":
        portal, target, lun = opts.get("portal"), opts.get("target"), opts.get("lun", 0)
        return f"{portal}/{target}/{lun}" if portal or target else None
    if driver == "gluster":
        return f"{opts.get('volume', '')}/{str(opts.get('path', '')).lstrip('/')}"
    if driver in ("nfs", "ssh"):
        server = _dict(opts.get("server"))
        return f"{server.get('host', '')}:{opts.get('path', '')}"
    if driver in ("http", "https", "ftp", "ftps"):
        return _str(opts.get("url"))
    if driver == "nvme":
        return f"{opts.get('device', '')}/{opts.get('namespace', 1)}"
    return _str(opts.get("filename") or opts.get("path") or opts.get("url"))


def legacy_location(proto: str, text: str) -> str:
    """The readable part of a legacy protocol string: ``rbd:pool/img:conf=...`` -> ``pool/img``."""
    if proto in ("file", "host_device") and ":" in text and not text.startswith("/"):
        return text.split(":", 1)[1]
    if proto == "rbd":
        return text[4:].split(":", 1)[0]
    if proto == "nbd" and text.startswith("nbd:"):
        rest = text[4:]
        export = ""
        if ":exportname=" in rest:
            rest, export = rest.split(":exportname=", 1)
        return f"{rest}/{export}" if export else rest
    if proto == "sheepdog":
        return text[9:]
    return text


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None


def protocol_of_filename(filename: str) -> tuple[dict[str, Any] | None, str]:
    """What a ``-drive file=`` string opens: (inline JSON node or None, protocol driver or "")."""
    if filename.startswith("json:"):
        try:
            data = json.loads(filename[5:])
        except json.JSONDecodeError:
            return None, ""
        if isinstance(data, dict):
            inner = data.get("file") if isinstance(data.get("file"), dict) else data
            return data, str(inner.get("driver", "")) if isinstance(inner, dict) else ""
        return None, ""
    for prefix, proto in _URL_PROTOCOLS:
        if filename.startswith(prefix):
            return None, proto
    if filename.startswith("/dev/"):
        return None, "host_device"  # QEMU's host_device driver claims /dev paths when it probes
    return None, "file"


def drive_tree(props: dict[str, Any]) -> tuple[dict[str, Any], bool | None]:
    """A ``-drive``'s options as a node tree (top = format node), and the write cache its cache= mode sets.

    ``-drive`` applies ``cache=`` and ``aio=`` to the whole tree; ``file=`` is a path or a
    protocol string, ``file.*`` keys describe the protocol node inline.
    """
    opts = nest(props)
    if "readonly" in opts:  # -drive's spelling of read-only
        opts.setdefault("read-only", opts.pop("readonly"))
    wce: bool | None = None
    mode = str(opts.pop("cache", "")).lower() if isinstance(opts.get("cache"), str) else ""
    if mode in CACHE_MODES:
        direct, no_flush, wce = CACHE_MODES[mode]
        cache = _dict(opts.get("cache"))
        cache.setdefault("direct", direct)
        cache.setdefault("no-flush", no_flush)
        opts["cache"] = cache
    if qemu_bool(_get(opts, "cache.writeback")) is not None:  # legacy -drive cache.writeback=
        wce = bool(qemu_bool(_get(opts, "cache.writeback")))
    fmt = opts.pop("format", None) or opts.get("driver")
    file_opt = opts.get("file")
    child: dict[str, Any]
    if isinstance(file_opt, dict):
        child = dict(file_opt)
    elif isinstance(file_opt, str):
        inline_json, proto = protocol_of_filename(file_opt)
        if inline_json is not None:
            if fmt is None and str(inline_json.get("driver", "")) in FORMAT_DRIVERS:
                return _drive_top(opts, inline_json), wce
            child = inline_json
        else:
            child = {"driver": proto, "filename": legacy_location(proto, file_opt)}
    else:
        child = {}
    if "driver" not in child and file_opt is not None:
        child["driver"] = "file"
    if fmt is not None and str(fmt).lower() not in FORMAT_DRIVERS and str(fmt).lower() not in FILTER_CHILD:
        # -drive driver=rbd,pool=...: the drive itself is the protocol node
        top = {k: v for k, v in opts.items() if k not in ("file",)}
        top["driver"] = str(fmt).lower()
        return top, wce
    top = {k: v for k, v in opts.items() if k != "file"}
    if fmt is not None:
        top["driver"] = str(fmt).lower()
        if child:
            top["file"] = child
        return top, wce
    # no format: QEMU probes the image; model the protocol node alone and leave the format unknown
    merged = dict(child)
    for key in ("cache", "aio", "discard", "detect-zeroes", "read-only", "node-name"):
        if key in top and key not in merged:
            merged[key] = top[key]
    merged["x-format-probed"] = True
    return merged, wce


def _drive_top(opts: dict[str, Any], tree: dict[str, Any]) -> dict[str, Any]:
    top = dict(tree)
    for key in ("cache", "aio", "discard", "detect-zeroes", "read-only"):
        if key in opts and key not in top:
            top[key] = opts[key]
    return top
