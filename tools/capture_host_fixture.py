#!/usr/bin/env python3
"""Capture this host's /proc, /sys, /etc and /dev entries that the host audit reads into a fixture tree.

    tools/capture_host_fixture.py tests/fixtures/hosts/<scenario>

Same as ``kvmtune capture-host``; usable from a source checkout without installing kvmtune.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from kvmtune.cli import main

if __name__ == "__main__":
    sys.exit(main(["capture-host", *sys.argv[1:]]))
