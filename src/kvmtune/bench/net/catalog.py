"""The network tests and tunings ``kvmtune bench net`` accepts.

Test names follow seed 002: ``rr1c-REQxRESP--USERS`` (request/response, one
connection per user) and ``str-readxSIZE--USERS`` / ``str-writexSIZE--USERS``
(streaming toward / away from the client); ``--matrix seed-002`` is its 20
tests (five workloads × 1, 10, 50, 250 users). netload runs them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvmtune.lab.net.netns import NetError

SEED_WORKLOADS = ("rr1c-1x1", "rr1c-200x1000", "rr1c-1000x30k", "str-readx30k", "str-writex30k")
SEED_USERS = (1, 10, 50, 250)
MATRICES = {"seed-002": tuple(f"{w}--{u}" for w in SEED_WORKLOADS for u in SEED_USERS)}
MAX_USERS = 1000
_SIZE = r"[0-9]+[kKmM]?"
_TEST = re.compile(rf"^(rr1c-{_SIZE}x{_SIZE}|str-(read|write)x{_SIZE})--([0-9]+)$")
# guest sysctls a run may set (--tune guest.KEY=VALUE): the network stack's, nothing else
_GUEST_SYSCTL = re.compile(r"^net\.(core|ipv4)\.[a-z0-9_.]+$")
_VALUE = re.compile(r"^[0-9 ]{1,64}$")


@dataclass(frozen=True)
class NetTest:
    name: str  # rr1c-200x1000--10
    workload: str  # rr1c-200x1000
    users: int

    @property
    def kind(self) -> str:
        return "rr" if self.workload.startswith("rr") else "str"


def parse_test(name: str) -> NetTest:
    m = _TEST.match(name.strip())
    if not m:
        raise NetError(
            f"unknown test {name!r}: tests are WORKLOAD--USERS with WORKLOAD one of {', '.join(SEED_WORKLOADS)} "
            "(or rr1c-REQxRESP, str-readxSIZE, str-writexSIZE), e.g. rr1c-200x1000--10"
        )
    users = int(m.group(3))
    if not 1 <= users <= MAX_USERS:
        raise NetError(f"test {name!r}: users must be 1..{MAX_USERS}")
    return NetTest(name.strip(), m.group(1), users)


def select_tests(tests: list[str] | None, matrix: str | None) -> list[NetTest]:
    names: list[str] = []
    if matrix:
        if matrix not in MATRICES:
            raise NetError(f"unknown matrix {matrix!r} (choose from {', '.join(MATRICES)})")
        names += MATRICES[matrix]
    names += tests or []
    if not names:
        names = ["rr1c-1x1--1", "str-readx30k--1"]
    out: list[NetTest] = []
    for n in names:
        t = parse_test(n)
        if t.name not in {x.name for x in out}:
            out.append(t)
    return out


@dataclass(frozen=True)
class Tunings:
    txqueuelen: int | None = None
    guest_sysctls: tuple[tuple[str, str], ...] = ()

    def as_dict(self) -> dict[str, object]:
        d: dict[str, object] = {}
        if self.txqueuelen is not None:
            d["txqueuelen"] = self.txqueuelen
        for k, v in self.guest_sysctls:
            d[f"guest.{k}"] = v
        return d

    def tag(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.as_dict().items())


def parse_tunings(text: str | None) -> Tunings:
    """``txqueuelen=2500,guest.net.ipv4.tcp_timestamps=0`` → :class:`Tunings`.

    Host-wide knobs (``halt_poll_ns`` and host sysctls) change the whole
    machine; ``kvmtune fix`` owns those, so they are refused here by name.
    """
    txq: int | None = None
    sysctls: list[tuple[str, str]] = []
    for item in (x.strip() for x in (text or "").split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise NetError(f"--tune {item!r}: expected KEY=VALUE")
        if key == "txqueuelen":
            if not value.isdigit():
                raise NetError(f"--tune txqueuelen={value}: a number")
            txq = int(value)
        elif key.startswith("guest."):
            sk = key.removeprefix("guest.")
            if not _GUEST_SYSCTL.match(sk) or not _VALUE.match(value):
                raise NetError(f"--tune {key}={value}: guest tunings are net.core.*/net.ipv4.* sysctls with numeric values")
            sysctls.append((sk, value))
        elif key == "halt_poll_ns":
            raise NetError(
                "--tune halt_poll_ns: a host-wide KVM parameter; set it with 'kvmtune fix' (journaled, undoable), "
                "then compare a run before and after"
            )
        else:
            raise NetError(f"--tune {key}: unknown tuning (txqueuelen, guest.net.core.*, guest.net.ipv4.*)")
    return Tunings(txq, tuple(sysctls))
