"""Asking running guests' QEMU guest agents about their inside (``kvmtune audit``, on by default).

A guest is asked when it runs now and has an agent channel: a libvirt domain through its
libvirt connection (``virDomainQemuAgentCommand``, which needs a read-write connection), a QEMU
process of this host through the socket its command line names for the agent's port. Each guest
gets one deadline (``--agent-timeout``, 5 s by default) for all its calls; guests are asked side
by side, so a host of silent agents costs about one deadline, not one per guest. A guest whose
agent does not answer costs one line in the report header and nothing else.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from typing import Any

from kvmtune.audit.engine import AuditResult
from kvmtune.errors import KvmtuneError
from kvmtune.guestagent.client import Agent, AgentError, Deadline, LibvirtAgent, SocketAgent
from kvmtune.guestagent.inside import read_inside
from kvmtune.host.sockets import SocketChanged, same_socket
from kvmtune.model.guest import Guest
from kvmtune.model.inside import GuestInside
from kvmtune.textsafe import safe

DEFAULT_TIMEOUT_S = 5.0
MAX_PARALLEL = 8


def _virtio_targets(guest: Guest) -> tuple[str, ...]:
    """The host's names of the guest's virtio disks: the guest's own names when it cannot list them."""
    return tuple(d.target for d in guest.disks if d.is_data_disk and d.bus == "virtio")


def _socket_problem(guest: Guest) -> str | os.stat_result:
    """Why this process's agent socket is not opened, or its ``lstat`` when it may be."""
    path = guest.agent_socket
    if path is None:
        return "its agent port's chardev is not a socket QEMU listens on by path"
    if not os.path.isabs(path):
        return "its agent socket path is relative"
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"its agent socket cannot be used ({exc.strerror})"
    owner = guest.process_owner
    if not stat.S_ISSOCK(st.st_mode) or owner is None or st.st_uid != owner[0]:
        return "its agent path is not a socket owned by the QEMU process's user; not opened"
    return st


def _ask(open_agent: Callable[[Deadline], Agent], via: str, timeout: float,
         fallback: tuple[str, ...]) -> GuestInside | str:
    deadline = Deadline(timeout)
    try:
        agent = open_agent(deadline)
    except AgentError as exc:
        return str(exc)
    try:
        return read_inside(agent, via, fallback)
    except AgentError as exc:
        return str(exc)
    except Exception as exc:  # whatever a hostile answer provokes costs this guest, not the audit
        return f"its answers could not be read ({type(exc).__name__})"
    finally:
        agent.close()


def _libvirt_opener(domain: Any) -> Callable[[Deadline], Agent]:
    return lambda deadline: LibvirtAgent(domain, deadline)


def _socket_opener(path: str, checked: os.stat_result) -> Callable[[Deadline], Agent]:
    """Connect to the very socket :func:`_socket_problem` checked: the path is the QEMU process owner's
    to change, so a socket swapped for a link (to another user's socket) after the check is not followed."""

    def open_agent(deadline: Deadline) -> Agent:
        try:
            with same_socket(path, checked) as reachable:
                return SocketAgent(reachable, deadline)
        except SocketChanged:
            raise AgentError("its agent socket changed after it was checked; not opened") from None
        except OSError as exc:
            raise AgentError(f"cannot connect ({exc.strerror})") from None

    return open_agent


def _libvirt_domains(uris: set[str], result: AuditResult) -> dict[tuple[str, str], Any]:
    """(uri, name) -> libvirt domain for the active domains of ``uris`` (read-write connections)."""
    from kvmtune.domain.connection import open_connection

    domains: dict[tuple[str, str], Any] = {}
    for uri in sorted(uris):
        try:
            conn = open_connection(uri, read_only=False)
        except KvmtuneError as exc:
            result.looked_at.append(f"guest agents of {uri} not asked: {exc}")
            continue
        try:
            for dom in conn.listAllDomains(1):  # VIR_CONNECT_LIST_DOMAINS_ACTIVE
                domains[(uri, dom.name())] = dom
        except Exception as exc:  # a libvirtError; libvirt is imported lazily
            result.looked_at.append(f"guest agents of {uri} not asked: {safe(str(exc).splitlines()[0])}")
    return domains


def add_guest_insides(result: AuditResult, *, timeout: float = DEFAULT_TIMEOUT_S, live_host: bool = True) -> None:
    """Fill ``guest.inside`` for every running guest whose agent answers within ``timeout``."""
    candidates = [g for g in result.guests if g.agent_channel and g.active and g.is_kvm_or_qemu]
    if not candidates:
        return
    libvirt_uuids = {g.uuid.lower() for g in result.guests if g.origin_kind == "libvirt" and g.uuid}
    jobs: list[tuple[Guest, Callable[[Deadline], Agent], str]] = []
    skipped: list[str] = []
    lv_guests = [g for g in candidates if g.origin_kind == "libvirt"]
    domains = _libvirt_domains({g.origin.split("#", 1)[0] for g in lv_guests}, result) if lv_guests else {}
    for guest in candidates:
        if guest.origin_kind == "libvirt":
            uri = guest.origin.split("#", 1)[0]
            dom = domains.get((uri, guest.name))
            if dom is not None:
                jobs.append((guest, _libvirt_opener(dom), f"libvirt {uri}"))
        elif guest.process_owner is not None and live_host:
            if guest.uuid and guest.uuid.lower() in libvirt_uuids:
                continue  # libvirt holds this agent's socket; it was asked through libvirt
            checked = _socket_problem(guest)
            if isinstance(checked, str):
                skipped.append(f"guest {safe(guest.name)}: inside not read: {checked}")
                continue
            path = str(guest.agent_socket)
            jobs.append((guest, _socket_opener(path, checked), f"agent socket {path}"))
    result.looked_at.extend(skipped)
    if not jobs:
        return
    from concurrent.futures import ThreadPoolExecutor  # here: most audits ask no agent

    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(jobs))) as pool:
        answers = list(pool.map(lambda job: _ask(job[1], job[2], timeout, _virtio_targets(job[0])), jobs))
    answered = 0
    for (guest, _, via), answer in zip(jobs, answers, strict=True):
        if isinstance(answer, str):
            result.looked_at.append(f"guest {safe(guest.name)}: guest agent ({safe(via)}) did not answer: "
                                    f"{safe(answer)}; its inside not audited")
            continue
        guest.inside = answer
        answered += 1
        result.looked_at.append(f"guest {safe(guest.name)}: inside read through its guest agent ({safe(via)}): "
                                f"{describe(answer)}")
    result.looked_at.append(f"guest agents: {answered} of {len(jobs)} answered")


def describe(inside: GuestInside) -> str:
    """One line of what was read (every value already fits a narrow pattern)."""
    parts = [{"linux": "Linux", "windows": "Windows"}.get(inside.os_kind or "", "unknown OS")
             + (f" {inside.kernel_release}" if inside.kernel_release else "")]
    if inside.schedulers:
        parts.append("schedulers " + ", ".join(f"{s.name}={s.current or '?'}" for s in inside.schedulers))
    if inside.clocksource:
        parts.append(f"clocksource {inside.clocksource}")
    if inside.rng_current:
        parts.append(f"hw rng {inside.rng_current}")
    if inside.thp_enabled:
        parts.append(f"THP {inside.thp_enabled}")
    if inside.drivers:
        parts.append(f"{len(inside.drivers)} device driver(s)")
    if inside.blocked:
        parts.append("blocked by the guest: " + ", ".join(sorted(set(inside.blocked))))
    if inside.unreadable:
        parts.append(f"{len(inside.unreadable)} answer(s) dropped as malformed")
    return "; ".join(parts)
