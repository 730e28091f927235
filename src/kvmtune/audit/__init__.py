"""The auditor: rules over the read-only models, producing findings."""
