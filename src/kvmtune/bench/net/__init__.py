"""``kvmtune bench net``: seed 002's network tiers over the lab's topologies (:mod:`kvmtune.lab.net`).

The probe-guest pairs (:mod:`.guest`), the no-guest datapath tier (:mod:`.datapath`), the test catalogue
(:mod:`.catalog`), and the seed's claims judged from stored cells (:mod:`.claims`, :mod:`.chart`).
"""
