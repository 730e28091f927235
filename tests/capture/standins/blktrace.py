"""A stand-in for ``blktrace`` where the kernel refuses real traces (this machine's kernel_lockdown(7) restricts
blktrace's debugfs files): ``-d DEV … -D DIR`` waits for SIGINT, then writes the binary records of
``KVMTUNE_BLKTRACE_RECORDS`` (a JSON list of [seconds, action, rwbs, sector, bytes], action D or C) into
``DIR/NAME.blktrace.0`` (``KVMTUNE_BLKTRACE_REPEAT`` times over) in blktrace's own format (``struct blk_io_trace``,
version 7), which the real ``blkparse`` then reads; ``-k -d DEV`` (tear a trace down) exits 0.
``KVMTUNE_BLKTRACE_FAIL`` set: prints it on stderr and exits 1 at once, as blktrace does when the kernel refuses.
Every call is appended to ``KVMTUNE_BLKTRACE_LOG``."""

from __future__ import annotations

import json
import os
import signal
import struct
import sys
import time

MAGIC = 0x65617400 | 0x07
TC = {"R": 1 << 0, "W": 1 << 1, "F": 1 << 2, "S": 1 << 3, "D": 1 << 13}
ISSUE, COMPLETE, TC_ISSUE, TC_COMPLETE = 7, 8, 1 << 6, 1 << 7


def record(seq: int, t: float, action: str, rwbs: str, sector: int, size: int) -> bytes:
    cats = sum(TC[c] for c in rwbs if c in TC) | (TC_ISSUE if action == "D" else TC_COMPLETE)
    code = (ISSUE if action == "D" else COMPLETE) | (cats << 16)
    return struct.pack("<IIQQIIIIIHH", MAGIC, seq, int(t * 1e9), sector, size, code, 4242, (7 << 20), 0, 0, 0)


def main(argv: list[str]) -> int:
    log = os.environ.get("KVMTUNE_BLKTRACE_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps(argv) + "\n")
    if "-k" in argv:
        return 0
    fail = os.environ.get("KVMTUNE_BLKTRACE_FAIL")
    if fail:
        print(fail, file=sys.stderr)
        return 1
    devices = [argv[i + 1] for i, a in enumerate(argv) if a == "-d"]
    out = argv[argv.index("-D") + 1]
    stop = []
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    while not stop:
        time.sleep(0.05)
    records = json.loads(os.environ.get("KVMTUNE_BLKTRACE_RECORDS", "[]"))
    # KVMTUNE_BLKTRACE_REPEAT=N: the records N times over, each round 10 ms later and 1 MiB further on (a busy device)
    records = [[t + k * 0.01, a, rwbs, sector + k * 2048, size]
               for k in range(int(os.environ.get("KVMTUNE_BLKTRACE_REPEAT", "1"))) for t, a, rwbs, sector, size in records]
    for dev in devices:
        name = os.path.basename(os.path.realpath(dev))
        with open(os.path.join(out, f"{name}.blktrace.0"), "wb") as f:
            f.write(b"".join(record(n, *r) for n, r in enumerate(records, 1)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
