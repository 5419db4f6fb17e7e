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
# Headless Chromium renders report.html in the tests (Debian's package; needs root and apt-get).
if [ "${WMCHECK_NO_BROWSER:-0}" != "1" ] && ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "setup: installing chromium for the HTML report tests"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
            || echo "setup: could not install chromium; the browser test will be skipped"
    else
        echo "setup: chromium not found and cannot be installed here; the browser test will be skipped"
    fi
fi
echo "setup: ready (.venv/bin/wmcheck)"
