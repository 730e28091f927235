"""Benchmarks measured on the user's own host, the product on top of the lab (:mod:`kvmtune.lab`): the storage
and network tiers and their matrix, seed claims and verdicts, reports and charts.

Everything here writes only below kvmtune's work directory (scratch images,
the probe guest cache) or to the results database, and cleans up what it
started (QEMU processes, loop devices) even on Ctrl-C.
"""
