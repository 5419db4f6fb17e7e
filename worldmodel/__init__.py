"""wmcheck.worldmodel."""
