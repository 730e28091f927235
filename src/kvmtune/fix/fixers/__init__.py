"""Fixers by topic group; each function is attached to one rule id with ``@xml_fixer``."""
