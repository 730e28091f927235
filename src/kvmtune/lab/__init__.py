"""The measuring lab the benchmarks (:mod:`kvmtune.bench`) and ``verify`` (:mod:`kvmtune.verify`) stand on:
the probe guest and its init, the QEMU launcher, the accelerator and its cache, the work directory and
leftovers, the shared cell runner, statistics, the verdict vocabulary, metrics and the results store;
namespaces, OVS and topologies (:mod:`.net`); the fio and netload drivers (:mod:`.storage`, :mod:`.net.netload`).

Everything here writes only below kvmtune's work directory (scratch images,
the probe guest cache) or to the results database, and cleans up what it
started (QEMU processes, loop devices, namespaces) even on Ctrl-C.
"""
