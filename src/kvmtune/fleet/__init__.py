"""Many hosts' results in one view: merge per-host audit JSON, keep each collection, show what changed."""
