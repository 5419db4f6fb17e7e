"""wmcheck.training."""
