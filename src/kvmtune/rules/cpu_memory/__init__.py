"""Audit rules: one rule per file, with its doc beside it."""
