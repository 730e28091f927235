"""Reading the host: one root object, pure parsers."""

from kvmtune.host.root import HostRoot, HostReadError

__all__ = ["HostRoot", "HostReadError"]
