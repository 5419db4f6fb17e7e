#!/usr/bin/env bash
# One-time set-up from a clean clone: a virtual environment in .venv with wmcheck installed
# (editable) plus its test and MuJoCo extras. Idempotent: re-running only installs what is missing.
#
# PyTorch: the project declares a range (GPU users need CUDA builds). Where no torch is present we
# install the CPU build first (from the local wheel cache on the team's CPU machines, otherwise from
# PyTorch's CPU index) so that pip does not pull a 5 GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    echo "setup: installing the CPU build of PyTorch"
    .venv/bin/python -m pip install -q "torch==2.13.0" \
        || .venv/bin/python -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
fi
extras=${WMCHECK_EXTRAS:-test,mujoco}
if ! .venv/bin/python -c "import wmcheck.scripts.cli, pytest, mujoco" 2>/dev/null || [ pyproject.toml -nt .venv/.wmcheck-installed ]; then
    echo "setup: installing wmcheck[$extras] into .venv"
    .venv/bin/python -m pip install -q -e ".[$extras]"
    touch .venv/.wmcheck-installed
fi
echo "setup: ready (.venv/bin/wmcheck)"
