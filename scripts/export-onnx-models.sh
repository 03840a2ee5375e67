#!/usr/bin/env bash
# Exports the U-Net, the encoder-decoder Transformer and Inception-v3 from PyTorch to
# ONNX, in training mode (scripts/export_onnx.py says what each is), into DIR (default
# models/onnx): the graphs issue 15 names that no ONNX zoo ships. Not part of the
# default test run: PyTorch is a large install, made once in target/torch-venv by
# scripts/torch-venv.sh; torchvision (for Inception-v3's definition) and onnx are added
# to it. Idempotent: does nothing when every file is there.
#
# Usage: scripts/export-onnx-models.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-models/onnx}
missing=""
for m in unet inception_v3 transformer; do
    [ -s "$DIR/$m.onnx" ] || missing="$missing,$m"
done
if [ -z "$missing" ]; then
    echo "export-onnx-models: all models already in $DIR"
    exit 0
fi
. scripts/torch-venv.sh
if ! with_stubs "$py" -c "import torchvision, onnx" 2>/dev/null; then
    # torchvision's wheel on PyPI may trail torch's by a release; only its pure-Python
    # model definitions are used, so it goes in without its dependencies.
    "$venv/bin/pip" install --disable-pip-version-check --no-cache-dir --no-deps torchvision
    "$venv/bin/pip" install --disable-pip-version-check --no-cache-dir onnx pillow
fi
with_stubs "$py" -W ignore scripts/export_onnx.py "$DIR" --models "${missing#,}"
