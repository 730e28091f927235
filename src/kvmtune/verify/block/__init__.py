"""verify's block tier: a guest disk's fix measured on scratch replicas served by qemu-storage-daemon, fio over NBD
(:mod:`.experiment` plans it, :mod:`.pair` runs the two sides)."""
