#!/usr/bin/env bash
# Fetches the "light" ONNX models (the ONNX backend test suite's ResNet-50, DenseNet-121,
# Inception v1/v2, VGG-19, ShuffleNet, SqueezeNet, AlexNet and ZFNet-512, with their
# weights replaced by ConstantOfShape nodes, a few KiB each) into DIR (default
# models/onnx). They ship inside the `onnx` wheel on PyPI: the wheel is downloaded with
# pip (or, without pip, with curl through PyPI's JSON API) and the files are extracted.
# Idempotent: does nothing when every file is there. Exits nonzero, saying why, on failure.
#
# Usage: scripts/fetch-onnx-models.sh [DIR]
set -euo pipefail

VERSION=1.17.0
MODELS="resnet50 densenet121 inception_v1 inception_v2 vgg19 shufflenet squeezenet bvlc_alexnet zfnet512"
DIR=${1:-models/onnx}

fail() {
    echo "fetch-onnx-models: $*" >&2
    exit 1
}

mkdir -p "$DIR" || fail "cannot create $DIR"
# One fetch at a time (test binaries may start it concurrently).
if command -v flock >/dev/null 2>&1; then
    exec 9>"$DIR/.fetch.lock"
    flock 9
fi

missing=""
for m in $MODELS; do
    [ -s "$DIR/light_$m.onnx" ] || missing="$missing $m"
done
if [ -z "$missing" ]; then
    echo "fetch-onnx-models: all models already in $DIR"
    exit 0
fi

command -v unzip >/dev/null 2>&1 || command -v python3 >/dev/null 2>&1 \
    || fail "needs unzip or python3 to extract the wheel"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# 1. The wheel: pip, python3 -m pip, or curl on PyPI's JSON API.
got=""
for pip in "pip" "pip3" "python3 -m pip"; do
    if $pip --version >/dev/null 2>&1; then
        if $pip download "onnx==$VERSION" --no-deps --only-binary=:all: -d "$work" -q >"$work/pip.log" 2>&1; then
            got=yes
            break
        fi
    fi
done
if [ -z "$got" ]; then
    command -v curl >/dev/null 2>&1 || fail "pip could not download onnx==$VERSION and curl is missing"
    json=$(curl -fsSL "https://pypi.org/pypi/onnx/$VERSION/json") \
        || fail "cannot reach https://pypi.org/pypi/onnx/$VERSION/json"
    url=$(printf '%s' "$json" | grep -o '"url": *"[^"]*\.whl"' | head -n 1 | sed 's/.*"\(https[^"]*\)"/\1/')
    [ -n "$url" ] || fail "no wheel listed for onnx $VERSION on PyPI"
    curl -fsSL -o "$work/${url##*/}" "$url" || fail "cannot download $url"
fi
wheel=$(ls "$work"/onnx-*.whl 2>/dev/null | head -n 1)
[ -n "$wheel" ] || fail "no onnx wheel was downloaded (pip said: $(tail -n 3 "$work/pip.log" 2>/dev/null))"

# 2. The light models out of it.
for m in $missing; do
    member="onnx/backend/test/data/light/light_$m.onnx"
    if command -v unzip >/dev/null 2>&1; then
        unzip -p "$wheel" "$member" >"$work/light_$m.onnx" 2>/dev/null || fail "$member is not in $(basename "$wheel")"
    else
        python3 - "$wheel" "$member" "$work/light_$m.onnx" <<'EOF' || fail "$member is not in the wheel"
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[3], "wb") as out:
    out.write(z.read(sys.argv[2]))
EOF
    fi
    [ -s "$work/light_$m.onnx" ] || fail "$member is empty in $(basename "$wheel")"
    mv "$work/light_$m.onnx" "$DIR/light_$m.onnx"
done
echo "fetch-onnx-models: wrote$(printf ' light_%s.onnx' $missing) to $DIR"
