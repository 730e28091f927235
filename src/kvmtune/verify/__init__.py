"""``kvmtune verify``: measure a finding's fix before trusting it.

For each fixable finding whose effect can be measured here, an *experiment*
(:mod:`kvmtune.verify.experiments`) measures the setting as it is (side A) and
as the fix would make it (side B), alternating A/B ``--repeat`` times, and
:mod:`kvmtune.verify.measure` judges the ratio on its 95 % interval.
"""
