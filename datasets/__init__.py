"""wmcheck.datasets."""
