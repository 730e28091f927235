"""verify's host tier: a host fix's runtime value measured in a kvmtune namespace, or host-wide through the journal
(:mod:`.experiment`)."""
