"""wmcheck.checks."""
