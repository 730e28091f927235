"""``kvmtune canary``: a fixed, versioned suite that measures the host's virtualization stack (not its guests), records
the environment of every run, and judges each run against the host's baseline (docs/canary.md)."""
