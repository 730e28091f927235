"""Storage benchmarks: the probe-guest matrix (:mod:`.guest`), the no-guest
``qemu-img bench`` tier (:mod:`.quick`), their configurations and presets
(:mod:`.matrix`), the fio jobs (:mod:`.fio`), host disk counters
(:mod:`.hostio`) and saved booted guests (:mod:`.snapshot`).

Each tier is a :class:`kvmtune.bench.runner.Benchmark` run by the one
:class:`kvmtune.bench.runner.BenchRunner`.
"""
