"""Storage benchmarks: the probe-guest matrix (:mod:`.guest`), the no-guest
``qemu-img bench`` tier (:mod:`.quick`), their configurations and presets
(:mod:`.matrix`), one run's settings and its matrix per tier (:mod:`.spec`), the
block tier (:mod:`.block`), host disk counters (:mod:`.hostio`) and saved booted
guests (:mod:`.snapshot`). The fio driver is the
lab's (:mod:`kvmtune.lab.storage.fio`).

Each tier is a :class:`kvmtune.lab.runner.Benchmark` run by the one
:class:`kvmtune.lab.runner.BenchRunner`.
"""
