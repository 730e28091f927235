"""Read-only models the rules look at."""
