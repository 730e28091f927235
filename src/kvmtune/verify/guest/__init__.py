"""verify's guest tier: guest-visible fixes measured in a probe-guest pair (:mod:`kvmtune.lab.probe`)."""
