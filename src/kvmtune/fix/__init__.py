"""Fixing: plans of changes (domain XML edits, drop-ins, runtime values, image conversions), shown as a
diff, applied with a journal written first, undone exactly from that journal. See docs/architecture.md §7."""
