"""Only here to tag the wheel: with netload inside (scripts/build-wheel.sh) it is no longer pure Python."""

import os

from setuptools import setup
from setuptools.dist import Distribution

NETLOAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "src", "kvmtune", "_bin", "netload")


class BinaryDistribution(Distribution):
    def has_ext_modules(self) -> bool:  # a platform wheel (linux_x86_64) when it carries the static binary
        return os.path.isfile(NETLOAD)


setup(distclass=BinaryDistribution)
