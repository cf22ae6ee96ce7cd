#!/usr/bin/env bash
# Create the virtual environment (if missing) and install trident-flows with its extras, at the
# exact versions of constraints.lock (every pip install below gets it with `-c`), so that CI and
# `make demo` run the versions known to pass; pyproject.toml holds the ranges a user installs against.
# To change a version: install it into .venv within pyproject.toml's ranges, run `make test` and
# `make test-slow`, then `make lock`, which regenerates constraints.lock from .venv (a pip freeze
# of it, less trident-flows; the file's header says what else it holds).
# Idempotent: pip skips what is already installed at the locked versions.
set -euo pipefail
python="${1:-python3}"
venv="${2:-.venv}"
lock="$(cd "$(dirname "$0")/.." && pwd)/constraints.lock"
if [ ! -x "$venv/bin/python" ]; then
  echo "creating $venv"
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q -c "$lock" --upgrade pip
# torch first, at the lock's version, the CPU build (2.13.0+cpu): its wheel is on disk on the
# project's machines; a torch left to a resolver (a model package requires one) would be a
# multi-GB CUDA build.
"$venv/bin/python" -m pip install -q -c "$lock" torch
"$venv/bin/python" -m pip install -q -c "$lock" -e ".[models,test,bench,corpus]"
# rapidocr-onnxruntime depends on the GUI build of OpenCV, which overwrites the headless one
# (and needs X libraries this kind of machine lacks). Keep exactly one, headless, build.
if "$venv/bin/python" -m pip show -q opencv-python >/dev/null 2>&1; then
  "$venv/bin/python" -m pip uninstall -q -y opencv-python
  "$venv/bin/python" -m pip install -q -c "$lock" --force-reinstall --no-deps opencv-python-headless
fi
echo "installed trident-flows into $venv"
