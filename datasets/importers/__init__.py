"""wmcheck.datasets.importers."""
