"""``kvmtune capture GUEST``: a running guest's own disk I/O, recorded from the host into a workload file."""
