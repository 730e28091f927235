"""verify's guest tier: guest-visible fixes measured in a probe-guest pair (:mod:`kvmtune.lab.probe`): disks and
controllers (:mod:`.disk`), NICs (:mod:`.nic`), the accelerator decided once a run (:mod:`.accel`)."""
