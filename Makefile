# The two commands the README documents. Both start by setting up .venv (idempotent).
.PHONY: setup demo test

setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/wmcheck demo

test: setup
	.venv/bin/python -m pytest
