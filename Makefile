# The two commands the README documents. Both start by setting up .venv (idempotent).
.PHONY: setup demo test lint format

setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/wmcheck demo

# One worker per core (pytest-xdist); tests sharing a trained fixture stay on one worker (tests/conftest.py).
test: setup lint
	.venv/bin/python -m pytest -n auto --dist loadgroup

# The formatter and linter (configured in pyproject.toml); `make format` applies them.
lint: setup
	.venv/bin/ruff format --check .
	.venv/bin/ruff check .

format: setup
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .
