"""Only here to tag the wheel. With netload inside (scripts/build-wheel.sh copies the static x86-64 binary to
src/kvmtune/_bin/) the wheel is ``py3-none-manylinux2014_x86_64``: any Python 3.11+, any glibc x86-64 Linux
(netload is static, so the oldest manylinux tag pip still accepts is true). Without it, ``py3-none-any``."""

import os

from setuptools import setup

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1 (Debian 12's 66): the wheel package's command
    from wheel.bdist_wheel import bdist_wheel

NETLOAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "src", "kvmtune", "_bin", "netload")
PLATFORM = "manylinux2014_x86_64"


def _x86_64_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError:
        return False
    return head[:4] == b"\x7fELF" and head[4] == 2 and int.from_bytes(head[18:20], "little") == 0x3E


class TaggedWheel(bdist_wheel):
    def finalize_options(self) -> None:
        super().finalize_options()
        if os.path.isfile(NETLOAD) and not _x86_64_elf(NETLOAD):
            raise SystemExit(f"setup.py: {NETLOAD} is not an x86-64 ELF binary: the wheel would be mis-tagged")

    def get_tag(self) -> tuple[str, str, str]:
        if os.path.isfile(NETLOAD):
            return "py3", "none", PLATFORM
        return "py3", "none", "any"


setup(cmdclass={"bdist_wheel": TaggedWheel})
