"""Reading the host: one root object, pure parsers."""

from kvmtune.host.root import HostReadError, HostRoot

__all__ = ["HostReadError", "HostRoot"]
