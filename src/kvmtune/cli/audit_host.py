"""The host and image inputs of ``kvmtune audit``: ``--host``, ``--images PATH…``, ``--no-images``.

:mod:`kvmtune.cli.audit` calls these (this module knows nothing of it). The
default audit (no input named) includes the host; audited domains bring their
local disk images along.
"""

from __future__ import annotations

import argparse
from typing import Any

from kvmtune.audit.collect_host import add_guest_images, add_host, add_images
from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import AuditResult


def add_options(p: Any) -> None:
    g = p.add_argument_group("host and disk images")
    g.add_argument("--host", action="store_true",
                   help="audit this host's tunables, devices and load (the tree given with --root, if any); "
                   "included in the default audit")
    g.add_argument("--images", nargs="+", default=[], metavar="PATH",
                   help="disk images to audit: files, block devices or directories of images")
    g.add_argument("--no-images", action="store_true",
                   help="do not audit the local disk images that audited domains use")


def named(args: argparse.Namespace) -> bool:
    """The host or images were asked for by name (so the default inputs are not added)."""
    return bool(args.host or args.images)


def collect(args: argparse.Namespace, ctx: AuditContext, result: AuditResult, explicit: bool) -> None:
    if args.host or not explicit:
        add_host(ctx, result)
    if args.images:
        add_images(args.images, ctx, result)


def after_guests(args: argparse.Namespace, ctx: AuditContext, result: AuditResult) -> None:
    """Inputs that depend on the guests gathered: their local disk images."""
    if not args.no_images and result.guests:
        add_guest_images(ctx, result)
