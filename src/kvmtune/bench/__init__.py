"""Benchmarks measured on the user's own host: the probe guest, accelerator
detection, the storage matrix, the results store, statistics and reports.

Everything here writes only below kvmtune's work directory (scratch images,
the probe guest cache) or to the results database, and cleans up what it
started (QEMU processes, loop devices) even on Ctrl-C.
"""
