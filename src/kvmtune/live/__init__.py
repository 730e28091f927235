"""Live sampling of running guests (``kvmtune top``, ``sample``, ``capacity``).

Sources produce counters (:mod:`.model`), :mod:`.signals` turns two snapshots into rates,
and :mod:`.diagnose` ties a rate past its threshold to the audit rules that explain it.
"""
