"""QEMU: command lines, qemu-img, partition tables."""
