"""After release: a competence-aware safety wrapper around a deployed policy (`guard.py`)."""
