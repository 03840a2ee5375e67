#!/usr/bin/env bash
# GPU check of pebble's executor, in two halves:
#
#   scripts/gpu-check.sh build        # here, no CUDA needed: builds the `cuda` binary,
#                                     # stripped, to dist/pebble-cuda
#   scripts/gpu-check.sh run [BIN]    # on the GPU machine: a budget sweep of `pebble train`
#                                     # on GPT and ResNet, then `pebble bench`; JSON lines
#                                     # to ${OUT:-gpu-out}/ and a summary on stdout
#
# Burn 0.21's CUDA backend loads the driver and compiles its kernels with NVRTC at run
# time, so the build half needs no CUDA toolkit. Record what `run` printed in docs/gpu.md.
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-}"
case "$mode" in
build)
    cargo build --release -p pebble-cli --features cuda
    mkdir -p dist
    cp "${CARGO_TARGET_DIR:-target}/release/pebble" dist/pebble-cuda
    strip dist/pebble-cuda
    ls -l dist/pebble-cuda
    ;;
run)
    bin="${2:-dist/pebble-cuda}"
    out="${OUT:-gpu-out}"
    mkdir -p "$out"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.csv"
    gpt=(--model gpt --layers 12 --width 768 --heads 12 --seq 1024 --batch 8)
    resnet=(--model resnet --layers 2 --width 64 --image 224 --batch 64)
    for spec in gpt resnet; do
        declare -n args="$spec"
        for budget in 100% 80% 60% 50% 40%; do
            for solver in store-all rotor sequential; do
                [[ "$solver" == store-all && "$budget" != 100% ]] && continue
                if "$bin" train "${args[@]}" --device cuda --costs profiled --budget "$budget" --solver "$solver" \
                    --steps 5 --json >"$out/$spec-$solver-$budget.json" 2>"$out/$spec-$solver-$budget.err"; then
                    python3 - "$out/$spec-$solver-$budget.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
steps = sorted(r["step_seconds"][1:] or r["step_seconds"])
mib = lambda b: "-" if b is None else f"{b / 2**20:.0f} MiB"
print(f'{r["model"]:8} {r["solver"]:12} budget {mib(r["budget_bytes"]):>10}  predicted {mib(r["predicted_peak_bytes"]):>10}'
      f'  measured {mib(r["measured_peak_bytes"]):>10}  step {steps[len(steps) // 2]:.3f} s  loss {r["losses"][0]:.3f} -> {r["losses"][-1]:.3f}')
PY
                else
                    echo "$spec $solver $budget: $(tail -1 "$out/$spec-$solver-$budget.err")"
                fi
            done
        done
    done
    "$bin" bench "${gpt[@]}" --device cuda --steps 5 | tee "$out/bench-gpt.txt"
    ;;
*)
    echo "usage: $0 build | run [BIN]" >&2
    exit 2
    ;;
esac
