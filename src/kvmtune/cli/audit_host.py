"""The host and image inputs of ``kvmtune audit``: ``--host``, ``--images PATH…``, ``--no-images``.

Registered into :mod:`kvmtune.cli.audit` through its ``EXTRA_OPTIONS`` and
``EXTRA_COLLECTORS`` hooks. The default audit (no input named) includes the
host; audited domains bring their local disk images along.
"""

from __future__ import annotations

import argparse
from typing import Any

from kvmtune.audit.collect_host import add_guest_images, add_host, add_images
from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import AuditResult
from kvmtune.cli.audit import EXTRA_COLLECTORS, EXTRA_OPTIONS


def add_options(p: Any) -> None:
    g = p.add_argument_group("host and disk images")
    g.add_argument("--host", action="store_true",
                   help="audit this host's tunables, devices and load (the tree given with --root, if any); "
                   "included in the default audit")
    g.add_argument("--images", nargs="+", default=[], metavar="PATH",
                   help="disk images to audit: files, block devices or directories of images")
    g.add_argument("--no-images", action="store_true",
                   help="do not audit the local disk images that audited domains use")


class HostImageCollector:
    def explicit(self, args: argparse.Namespace) -> bool:
        return bool(getattr(args, "host", False) or getattr(args, "images", None))

    def collect(self, args: argparse.Namespace, ctx: AuditContext, result: AuditResult, explicit: bool) -> None:
        if getattr(args, "host", False) or not explicit:
            add_host(ctx, result)
        if getattr(args, "images", None):
            add_images(args.images, ctx, result)

    def after_guests(self, args: argparse.Namespace, ctx: AuditContext, result: AuditResult) -> None:
        if not getattr(args, "no_images", False) and result.guests:
            add_guest_images(ctx, result)


if add_options not in EXTRA_OPTIONS:
    EXTRA_OPTIONS.append(add_options)
if not any(isinstance(c, HostImageCollector) for c in EXTRA_COLLECTORS):
    EXTRA_COLLECTORS.append(HostImageCollector())
