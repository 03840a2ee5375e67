#!/usr/bin/env bash
# The one setup path for a fresh machine, called by the README's two commands and by
# .ci/run. Everything else pebble needs comes from crates.io through cargo.
#
# What it installs, and why (only what is missing; Debian/Ubuntu packages through apt-get,
# with sudo when not root):
#   - cmake and a C++ compiler: HiGHS, the MILP solver behind checkmate, rockmate and
#     hiremate, is built from source by the highs-sys crate;
#   - libclang: highs-sys generates its Rust bindings with bindgen, which loads libclang.
# With --tests it also fetches the ONNX test suite's light models into models/onnx
# (scripts/fetch-onnx-models.sh, a few KiB each, from the onnx wheel on PyPI), which the
# ONNX import tests read; that needs pip or curl, and unzip or python3. And it builds the
# Python package `pebble` into target/torch-venv with PyTorch, transformers and
# torchvision for its tests (scripts/py-venv.sh --torch; python3 3.10 or later).
#
# Usage: scripts/setup.sh [--tests]
# Idempotent: does nothing when everything is there. Exits nonzero, saying why, on failure.
set -euo pipefail
cd "$(dirname "$0")/.."

tests=""
for arg in "$@"; do
    case "$arg" in
        --tests) tests=yes ;;
        *) echo "setup: unknown argument '$arg' (usage: scripts/setup.sh [--tests])" >&2; exit 2 ;;
    esac
done

command -v cargo >/dev/null 2>&1 || { echo "setup: cargo is required (install Rust with rustup)" >&2; exit 1; }

have_libclang() {
    [ -n "${LIBCLANG_PATH:-}" ] && return 0
    for f in /usr/lib/llvm-*/lib/libclang.so* /usr/lib/llvm-*/lib/libclang-[0-9]*.so* \
        /usr/lib/*/libclang.so* /usr/lib/*/libclang-[0-9]*.so*; do
        [ -e "$f" ] && return 0
    done
    return 1
}

packages=""
command -v cmake >/dev/null 2>&1 || packages="$packages cmake"
command -v c++ >/dev/null 2>&1 || packages="$packages g++"
have_libclang || packages="$packages libclang-dev"
if [ -n "$tests" ]; then
    { command -v pip >/dev/null 2>&1 || command -v pip3 >/dev/null 2>&1 \
        || python3 -m pip --version >/dev/null 2>&1 || command -v curl >/dev/null 2>&1; } \
        || packages="$packages curl"
    { command -v unzip >/dev/null 2>&1 || command -v python3 >/dev/null 2>&1; } || packages="$packages unzip"
    # The Python tests' venv (scripts/py-venv.sh): python3 with venv and pip.
    python3 -m venv --help >/dev/null 2>&1 || packages="$packages python3-venv"
fi

if [ -n "$packages" ]; then
    command -v apt-get >/dev/null 2>&1 \
        || { echo "setup: missing:$packages; install them with your package manager (no apt-get here)" >&2; exit 1; }
    sudo_cmd=""
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null 2>&1 || { echo "setup: missing:$packages; run as root or install sudo" >&2; exit 1; }
        sudo_cmd=sudo
    fi
    echo "setup: installing$packages (apt-get)" >&2
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq $packages >/dev/null
fi

if [ -n "$tests" ]; then
    scripts/fetch-onnx-models.sh >&2
    # The Python package and PyTorch for its tests, in target/torch-venv.
    scripts/py-venv.sh --torch >&2
fi
