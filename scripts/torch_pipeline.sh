#!/usr/bin/env bash
# Runs pebble's pipeline plans on PyTorch ranks (CPU, gloo) and checks them against
# PyTorch's own schedules: scripts/torch_pipeline.py, on the plans and exports of
# scripts/fixtures/torch/ (or the PLAN.json ACTIONS.csv pairs given). Not part of the
# default test run: PyTorch is a large install, made here only, in target/torch-venv.
#
# PyTorch is installed once by scripts/torch-venv.sh.
#
# Usage: scripts/torch_pipeline.sh [PLAN.json ACTIONS.csv]...
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/torch-venv.sh

with_stubs "$py" scripts/torch_pipeline.py "$@"
