"""The probe-guest pair: two probe guests, A (as it is) and B (as fixed), booted once and driven through their
guest agents; their virtual hardware (:mod:`.side`), their kernel (:mod:`.kernel`), their network (:mod:`.net`)."""
