"""The host and image options of ``kvmtune audit``: ``--host``, ``--images PATH…``, ``--no-images``.

:mod:`kvmtune.cli.audit` adds these to its parser and hands them to
:func:`kvmtune.audit.collect.gather` as a :class:`~kvmtune.audit.collect.Sources`. The default audit
(no input named) includes the host; audited domains bring their local disk images along.
"""

from __future__ import annotations

import argparse


def add_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("host and disk images")
    g.add_argument("--host", action="store_true",
                   help="audit this host's tunables, devices and load (the tree given with --root, if any); "
                   "included in the default audit")
    g.add_argument("--images", nargs="+", default=[], metavar="PATH",
                   help="disk images to audit: files, block devices or directories of images")
    g.add_argument("--no-images", action="store_true",
                   help="do not audit the local disk images that audited domains use")
