"""kvmtune: audit, fix and benchmark KVM guests and hosts."""

__version__ = "0.1.0"

# Written by scripts/build-wheel.sh and scripts/build-deb.sh when they build (never by a checkout, never at start-up):
# {"version": ..., "commit": ..., "netload": "0.4.1" or null when the build carries no netload}.
BUILD_STAMP = "_build.json"


def version_line() -> str:
    """What ``kvmtune --version`` prints: the version, and the commit and netload's version stamped at build time."""
    import json  # here, not at the top: every kvmtune start imports this package
    from importlib import resources

    try:
        stamp = json.loads(resources.files(__name__).joinpath(BUILD_STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"kvmtune {__version__} (unstamped: run from a checkout, not a build)"
    if not isinstance(stamp, dict):
        return f"kvmtune {__version__} (unstamped: {BUILD_STAMP} is not an object)"
    netload = stamp.get("netload")
    carried = f"netload {netload}" if netload else "netload not included in this build"
    return f"kvmtune {stamp.get('version', __version__)} (commit {stamp.get('commit', 'unknown')}, {carried})"
