#!/usr/bin/env bash
# Builds the annal Python package and runs its tests: the binding's own tests,
# LangGraph's checkpointer conformance suite (every base and extended capability) and a
# StateGraph run end to end on AnnalSaver.
#
# It needs python3 (3.10 or later) with venv; everything else comes from the package
# index, pinned in python/requirements.txt, into the virtual environment target/py-venv
# (override with ANNAL_PY_VENV). The extension is built with maturin into the
# repository's target/ folder.
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${ANNAL_PY_VENV:-$PWD/target/py-venv}"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r python/requirements.txt
VIRTUAL_ENV="$venv" CARGO_TARGET_DIR="$PWD/target" \
    "$venv/bin/maturin" develop --release --manifest-path python/Cargo.toml
cd python
"$venv/bin/python" -m pytest -q -rs tests "$@"
