"""wmcheck.scripts."""
