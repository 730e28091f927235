from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Tests press Ctrl-C (SIGINT) on kvmtune children, as a user at a terminal would. A background job of a
# non-interactive shell (`.ci/run &` in a script) starts with SIGINT ignored, and its children inherit that, so
# they would never see the key; a handler, unlike SIG_IGN, is reset to the default when a child execs.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
SHARED = REPO.parent / "shared"
CORPUS = SHARED / "corpus" / "libvirt"


@pytest.fixture
def corpus() -> Path:
    if not CORPUS.is_dir():
        pytest.skip(f"corpus not found at {CORPUS}")
    return CORPUS
HOSTS = REPO / "tests" / "fixtures" / "hosts"


def variant(base: str, tmp: Path, edits: dict[str, str | bytes | None]) -> Path:
    """Copy a fixture host tree and change files in it (None deletes; a str or bytes replaces)."""
    root = tmp / f"{base}-variant"
    shutil.copytree(HOSTS / base, root, symlinks=True)
    for path, content in edits.items():
        p = root / path.lstrip("/")
        if content is None:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p.exists() or p.is_symlink():
                p.unlink()
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)
    return root


@pytest.fixture
def make_variant(tmp_path: Path) -> Callable[[str, dict[str, str | bytes | None]], Path]:
    def make(base: str, edits: dict[str, str | bytes | None]) -> Path:
        return variant(base, tmp_path, edits)

    return make


@pytest.fixture(scope="session")
def libvirt_uri() -> Iterator[str]:
    """A real libvirtd on qemu:///system, started by the project's own script if needed."""
    libvirt = pytest.importorskip("libvirt")
    proc = subprocess.run(["bash", str(REPO / "scripts" / "services.sh"), "libvirtd-start"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    libvirt.registerErrorHandler(lambda _c, _e: None, None)
    before = set(LIBVIRT_LOGS.glob("kvmtune-*.log"))
    yield "qemu:///system"
    # libvirt keeps a domain's log after the domain is gone: the tests' own domains (named kvmtune-…, created in
    # this session, no longer known to libvirtd) leave nothing behind
    try:
        conn = libvirt.open("qemu:///system")
        known = {d.name() for d in conn.listAllDomains()}
        conn.close()
    except libvirt.libvirtError:
        return
    for log in set(LIBVIRT_LOGS.glob("kvmtune-*.log")) - before:
        if log.name.removesuffix(".log") not in known:
            log.unlink(missing_ok=True)


LIBVIRT_LOGS = Path("/var/log/libvirt/qemu")


@pytest.fixture(autouse=True)
def _own_bench_lock(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test gets its own host benchmark lock: tests (and helpers' test runs beside them) are
    independent; the one-benchmark-per-host refusal is tested by pointing two runs at one lock."""
    if "KVMTUNE_BENCH_LOCK" not in os.environ:
        monkeypatch.setenv("KVMTUNE_BENCH_LOCK", str(tmp_path_factory.mktemp("benchlock") / "bench.lock"))
