"""Example simulators shipped with wmcheck: hand-engineered models to check against real logs."""
