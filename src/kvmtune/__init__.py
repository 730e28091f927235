"""kvmtune: audit, fix and benchmark KVM guests and hosts."""

__version__ = "0.1.0"
