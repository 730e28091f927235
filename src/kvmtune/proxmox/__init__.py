"""Proxmox VE: its VM configs (``qm.conf(5)``), its storage.cfg, and ``qm set`` in its own terms."""
