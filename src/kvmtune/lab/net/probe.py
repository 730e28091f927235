"""Reachability probes run inside a namespace. Standard library only; run by path.

``ping`` sends ICMP echo requests of a given payload size with the
don't-fragment bit set (like ``ping -M do -s SIZE``), so a 8972-byte ping only
succeeds when every hop carries 9000-byte packets; it needs no iputils.
``tcp-serve``/``tcp-check`` prove a TCP path (user-mode networking forwards
TCP only). Each prints one JSON object.

    probe.py ping ADDR [--size N] [--count N] [--timeout S] [--no-df]
    probe.py tcp-serve --port P [--max-seconds S]
    probe.py tcp-check ADDR PORT [--size N] [--timeout S]
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import select
import socket
import struct
import sys
import time

IP_MTU_DISCOVER, IP_PMTUDISC_DO, IP_PMTUDISC_DONT = 10, 2, 0


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total: int = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def ping(addr: str, size: int, count: int, timeout: float, df: bool) -> dict[str, object]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO if df else IP_PMTUDISC_DONT)
    ident = os.getpid() & 0xFFFF
    payload = (b"kvmtune" * (size // 7 + 1))[:size]
    rtts: list[float] = []
    errors: list[str] = []
    for seq in range(1, count + 1):
        header = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
        packet = struct.pack("!BBHHH", 8, 0, _checksum(header + payload), ident, seq) + payload
        start = time.monotonic()
        try:
            sock.sendto(packet, (addr, 0))
        except OSError as exc:
            errors.append(exc.strerror or str(exc))
            continue
        deadline = start + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select([sock], [], [], left)
            if not ready:
                break
            data, src = sock.recvfrom(size + 256)
            ihl = (data[0] & 0x0F) * 4
            if len(data) < ihl + 8 or src[0] != addr:
                continue
            typ, _code, _ck, rid, rseq = struct.unpack("!BBHHH", data[ihl : ihl + 8])
            if typ == 0 and rid == ident and rseq == seq and len(data) - ihl - 8 == size:
                rtts.append(round((time.monotonic() - start) * 1000, 3))
                break
    return {"probe": "ping", "address": addr, "size": size, "df": df, "sent": count, "received": len(rtts),
            "rtt_ms": rtts, "errors": sorted(set(errors))}


def tcp_serve(port: int, max_seconds: float) -> int:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(8)
    print(json.dumps({"probe": "tcp-serve", "port": port, "ready": True}), flush=True)
    deadline = time.monotonic() + max_seconds
    while time.monotonic() < deadline:
        ready, _, _ = select.select([srv], [], [], 0.5)
        if not ready:
            continue
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(5)
            try:
                while data := conn.recv(65536):
                    conn.sendall(data)
            except OSError:
                pass
    return 0


def tcp_check(addr: str, port: int, size: int, timeout: float) -> dict[str, object]:
    start = time.monotonic()
    payload = (b"kvmtune" * (size // 7 + 1))[:size]
    try:
        with socket.create_connection((addr, port), timeout=timeout) as conn:
            conn.sendall(payload)
            got = b""
            while len(got) < size:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                got += chunk
        ok = got == payload
        err = None if ok else f"echo mismatch ({len(got)} of {size} bytes)"
    except OSError as exc:
        ok, err = False, exc.strerror or str(exc)
    return {"probe": "tcp-check", "address": addr, "port": port, "size": size, "ok": ok, "error": err,
            "seconds": round(time.monotonic() - start, 4)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("ping")
    p.add_argument("address")
    p.add_argument("--size", type=int, default=56)
    p.add_argument("--count", type=int, default=3)
    p.add_argument("--timeout", type=float, default=2.0)
    p.add_argument("--no-df", action="store_true")
    s = sub.add_parser("tcp-serve")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--max-seconds", type=float, default=600)
    c = sub.add_parser("tcp-check")
    c.add_argument("address")
    c.add_argument("port", type=int)
    c.add_argument("--size", type=int, default=4096)
    c.add_argument("--timeout", type=float, default=5.0)
    args = ap.parse_args(argv)
    if args.cmd != "tcp-serve" and ipaddress.ip_address(args.address) not in ipaddress.ip_network("198.18.0.0/15"):
        print(f"probe: {args.address} is outside 198.18.0.0/15; kvmtune probes nothing else", file=sys.stderr)
        return 2
    if args.cmd == "ping":
        out = ping(args.address, args.size, max(1, min(args.count, 100)), args.timeout, not args.no_df)
        print(json.dumps(out))
        return 0 if out["received"] else 1
    if args.cmd == "tcp-serve":
        return tcp_serve(args.port, args.max_seconds)
    out = tcp_check(args.address, args.port, args.size, args.timeout)
    print(json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
