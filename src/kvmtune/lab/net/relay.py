"""A stand-in guest NIC: copies Ethernet frames between a host-side backend and
a tap inside a "guest" namespace. Standard library only; run by path.

Side A is what QEMU would open: a tap by name (opened in the namespace this
process starts in), a macvtap character device, or a unix datagram socket
that QEMU's ``-netdev dgram`` talks to (user-mode networking checks). Side B
is a tap in the stand-in guest's namespace, which this process enters with
setns(2) after opening side A. It prints ``READY`` once both are open and
runs until SIGTERM/SIGINT or ``--max-seconds``.

    relay.py --rundir DIR --a tap:NAME|chardev:PATH|dgram:BIND:PEER --b-netns NS --b-tap eth0
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import os
import select
import signal
import socket
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI = 0x0002, 0x1000
CLONE_NEWNET = 0x40000000
FRAME_MAX = 65536 + 64


def open_tap(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


def open_chardev(path: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    # macvtap opens with a virtio-net header; plain frames are simpler for a stand-in
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", b"", IFF_TAP | IFF_NO_PI))
    return fd


def enter_netns(name: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


class Side:
    def __init__(self, fd: int | None = None, sock: socket.socket | None = None, peer: str = "") -> None:
        self.fd, self.sock, self.peer = fd, sock, peer

    def fileno(self) -> int:
        return self.sock.fileno() if self.sock is not None else int(self.fd)  # type: ignore[arg-type]

    def read(self) -> bytes:
        if self.sock is not None:
            return self.sock.recv(FRAME_MAX)
        return os.read(int(self.fd), FRAME_MAX)  # type: ignore[arg-type]

    def write(self, frame: bytes) -> None:
        try:
            if self.sock is not None:
                self.sock.sendto(frame, self.peer)
            else:
                os.write(int(self.fd), frame)  # type: ignore[arg-type]
        except OSError:
            pass  # a dropped frame, as on a real wire


def open_a(spec: str) -> Side:
    kind, _, rest = spec.partition(":")
    if kind == "tap":
        return Side(fd=open_tap(rest))
    if kind == "chardev":
        return Side(fd=open_chardev(rest))
    if kind == "dgram":
        bind, _, peer = rest.partition(":")
        with contextlib.suppress(OSError):
            os.unlink(bind)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(bind)
        return Side(sock=sock, peer=peer)
    raise SystemExit(f"relay: unknown side A {spec!r}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rundir", required=True, help="the run directory (marks this process as the run's)")
    ap.add_argument("--a", required=True)
    ap.add_argument("--b-netns", required=True)
    ap.add_argument("--b-tap", default="eth0")
    ap.add_argument("--max-seconds", type=float, default=6 * 3600)
    args = ap.parse_args(argv)

    def on_signal(_sig: int, _frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        a = open_a(args.a)
        enter_netns(args.b_netns)
        b = Side(fd=open_tap(args.b_tap))
    except OSError as exc:
        print(f"relay: {exc}", file=sys.stderr, flush=True)
        return 1
    print("READY", flush=True)
    other = {a.fileno(): b, b.fileno(): a}
    by_fd = {a.fileno(): a, b.fileno(): b}
    deadline = time.monotonic() + args.max_seconds
    while time.monotonic() < deadline:
        ready, _, _ = select.select(list(by_fd), [], [], 1.0)
        for fd in ready:
            try:
                frame = by_fd[fd].read()
            except OSError:
                continue
            if frame:
                other[fd].write(frame)
    return 0


if __name__ == "__main__":
    sys.exit(main())
