#!/usr/bin/env bash
# GPU check of pebble's executor, in two halves:
#
#   scripts/gpu-check.sh build        # here, no CUDA needed: builds the `cuda` binary,
#                                     # stripped, to dist/pebble-cuda
#   scripts/gpu-check.sh run [BIN]    # on the GPU machine: `pebble train` under the solvers and
#                                     # policies of issues 11-13 on GPT-2 small, then `pebble bench`; JSON
#                                     # to ${OUT:-gpu-out}/ and a summary on stdout
#   scripts/gpu-check.sh torch [WHEEL] # on the GPU machine: pebble.torch's acceptance models
#                                     # (GPT-2, ResNet-50, U-Net) under every solver at 40/60/80%
#                                     # on CUDA (crates/python/bench/gpu_check.py: peak by
#                                     # torch.cuda.max_memory_allocated), then the head-to-head
#                                     # benchmark (compile included); WHEEL: the abi3 wheel built
#                                     # here by `target/py-venv/bin/maturin build --release -m
#                                     # crates/python/Cargo.toml` (to target/wheels), installed
#                                     # into /tmp/site beside the machine's own torch
#   scripts/gpu-check.sh overlap [BIN] # on the GPU machine: the offloading runs on a 4-layer GPT,
#                                     # each as shipped, without the device sync before a transfer
#                                     # (PEBBLE_TRANSFER_SYNC=0) and with reads queued on a copy
#                                     # stream (PEBBLE_CUDA_READ=queued), then the other solvers
#
# Burn 0.21's CUDA backend loads the driver and compiles its kernels with NVRTC at run
# time, so the build half needs no CUDA toolkit. Record what `run` printed in docs/gpu.md.
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-}"
case "$mode" in
build)
    scripts/setup.sh
    cargo build --release -p pebble-cli --features cuda
    mkdir -p dist
    cp "${CARGO_TARGET_DIR:-target}/release/pebble" dist/pebble-cuda
    strip dist/pebble-cuda
    ls -l dist/pebble-cuda
    ;;
torch)
    wheel="${2:-$(ls -t target/wheels/pebble-*abi3*.whl 2>/dev/null | head -1)}"
    [ -f "$wheel" ] || { echo "gpu-check: no pebble wheel in target/wheels (build one with maturin build --release -m crates/python/Cargo.toml)" >&2; exit 2; }
    out="${OUT:-gpu-out}"
    mkdir -p "$out"
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$wheel"
    export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.csv"
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
    timeout "${RUN_TIMEOUT:-300}" python3 crates/python/bench/gpu_check.py --device "${DEVICE:-cuda}" \
        --out "$out/torch-acceptance.json" 2>"$out/torch-acceptance.err" | tee "$out/torch-acceptance.txt" || true
    for model in gpt2 resnet50; do
        timeout "${RUN_TIMEOUT:-300}" python3 crates/python/bench/head_to_head.py --model "$model" --device "${DEVICE:-cuda}" \
            --out "$out/head_to_head_${model}.json" 2>"$out/head_to_head_${model}.err" | tail -30 || true
    done
    ;;
run | overlap)
    bin="${2:-dist/pebble-cuda}"
    out="${OUT:-gpu-out}"
    device="${DEVICE:-cuda}"
    mkdir -p "$out"
    # Burn's CUDA backend loads libcuda and NVRTC at run time: put every NVRTC found on
    # the loader's path (the CUDA toolkit's, or the one PyTorch's wheels ship).
    if [[ "$device" == cuda ]]; then
        command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.csv"
        for lib in $(find /usr/local /opt /usr/lib -name 'libnvrtc.so*' -not -path '*/stubs/*' 2>/dev/null | head -20); do
            LD_LIBRARY_PATH="$(dirname "$lib"):${LD_LIBRARY_PATH:-}"
        done
        export LD_LIBRARY_PATH RUST_BACKTRACE=1
        echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
        ldconfig -p | grep -E 'libcuda\.so|libnvrtc' || true
    fi
    # One run of `pebble train`: its JSON to $out/NAME.json, one summary line on stdout.
    train() {
        local name="$1"
        shift
        if ((SECONDS > ${DEADLINE:-100000})); then
            echo "$name: skipped (past the deadline of $DEADLINE s)"
            return
        fi
        local t0=$SECONDS
        if timeout "${RUN_TIMEOUT:-120}" "$bin" train "$@" --device "$device" --json >"$out/$name.json" 2>"$out/$name.err"; then
            python3 - "$out/$name.json" "$name" "$((SECONDS - t0))" <<'PY' || echo "$name: ran, but its JSON did not parse"
import json, sys
r = json.load(open(sys.argv[1]))
steps = sorted(r["step_seconds"][1:] or r["step_seconds"])
step = steps[len(steps) // 2]
mib = lambda b: "-" if b is None else f"{b / 2**20:.0f}"
sim = r["predicted_time"]
meas_peak, pred_peak = r["measured_peak_bytes"], r["predicted_peak_bytes"]
print(f'{sys.argv[2]:22} budget {mib(r["budget_bytes"]):>6} MiB  peak sim {mib(pred_peak):>6} meas {mib(meas_peak):>6} MiB'
      f' ({100 * (meas_peak / pred_peak - 1):+.1f}%)  step sim {sim:.3f} meas {step:.3f} s ({100 * (step / sim - 1):+.1f}%)'
      f'  host sim {mib(r.get("predicted_host_peak_bytes"))} meas {mib(r.get("measured_host_peak_bytes"))} MiB'
      f'  off/rel/rec {r.get("offloads")}/{r.get("reloads")}/{r.get("recomputes")}'
      f'  link busy d2h {sum(r["d2h_busy"][1:]) / max(1, len(r["d2h_busy"]) - 1):.3f} (sim {r["predicted_d2h_busy"]:.3f}) s'
      f'  stall {sorted(r["compute_stall"])[len(r["compute_stall"]) // 2]:.3f} (sim {r["predicted_compute_stall"]:.3f}) s'
      f'  loss {" ".join(f"{l:.6f}" for l in r["losses"])}  [{sys.argv[3]} s]')
PY
        else
            echo "$name: failed after $((SECONDS - t0)) s: $(tail -3 "$out/$name.err" | tr '\n' ' ')"
        fi
    }
    # A small GPT first: if the backend cannot start, say so at once.
    small=(--model gpt --layers 2 --width 256 --heads 4 --seq 256 --batch 4 --steps 3)
    if [[ "${SMOKE:-1}" == 1 ]]; then
        train smoke-store-all "${small[@]}" --solver store-all --budget 100%
        if ! grep -q '"losses"' "$out/smoke-store-all.json" 2>/dev/null; then
            cat "$out/smoke-store-all.err"
            exit 1
        fi
    fi
    if [[ "$mode" == overlap ]]; then
        # Do the copies leave the compute path once the executor stops synchronising the
        # device before each transfer? The same runs with the sync (as shipped) and
        # without it, on a 4-layer GPT whose step is short enough to repeat, the link
        # throttled below the real one; then the other solvers once each.
        gpt=(--model gpt --layers 4 --width 512 --heads 8 --seq 512 --batch 8 --profile h100
            --costs "${COSTS:-profiled}" --bandwidth "${BANDWIDTH:-10e9}" --steps "${STEPS:-4}")
        # Each offloading run three ways: as shipped (`sync`: the device synchronised before
        # each transfer), without that sync (`nosync`), and with reads queued on a copy
        # stream when the offload is issued (`queued`: PEBBLE_CUDA_READ=queued, src/cuda.rs).
        variant() {
            local name="$1" how="$2"
            shift 2
            case "$how" in
            sync) train "$name" "$@" ;;
            nosync) PEBBLE_TRANSFER_SYNC=0 train "$name-nosync" "$@" ;;
            queued) PEBBLE_CUDA_READ=queued train "$name-queued" "$@" ;;
            esac
        }
        read -ra variants <<<"${VARIANTS:-sync nosync queued}"
        for planner in "--policy delta" "--solver pofo" "--solver offload-dp"; do
            read -ra p <<<"$planner"
            for how in "${variants[@]}"; do
                variant "${p[1]}-50" "$how" "${gpt[@]}" "${p[@]}" --budget 50%
            done
        done
        train store-all "${gpt[@]}" --solver store-all --budget 100%
        train rotor-50 "${gpt[@]}" --solver rotor --budget 50%
        train zero-offload-50 "${gpt[@]}" --solver zero-offload --budget 50%
        for how in "${variants[@]}"; do
            variant offmate-40 "$how" "${gpt[@]}" --solver offmate --budget 40%
        done
        exit 0
    fi
    # GPT-2 small (12 x 768, sequence 1024, batch 8) on costs profiled on the device
    # (COSTS=steps: each stage then timed in store-all steps), the link throttled to a
    # rate below the real one; one run per issue's solver or policy.
    read -ra model <<<"${MODEL:---model gpt --layers 12 --width 768 --heads 12 --seq 1024 --batch 8}"
    gpt=("${model[@]}" --profile h100 --costs "${COSTS:-profiled}" --bandwidth "${BANDWIDTH:-10e9}" --steps "${STEPS:-4}")
    train gpt-store-all "${gpt[@]}" --solver store-all --budget 100%
    train gpt-pofo-50 "${gpt[@]}" --solver pofo --budget 50%          # issue 11
    train gpt-offmate-40 "${gpt[@]}" --solver offmate --budget 40%    # issue 12
    train gpt-delta-50 "${gpt[@]}" --policy delta --budget 50%        # issue 13
    train gpt-dtr-50 "${gpt[@]}" --policy dtr --budget 50%            # issue 13
    train gpt-zero-offload-50 "${gpt[@]}" --solver zero-offload --budget 50%   # issue 12
    train gpt-rotor-50 "${gpt[@]}" --solver rotor --budget 50%
    train gpt-autocapper-50 "${gpt[@]}" --solver autocapper --budget 50%       # issue 11
    train gpt-offload-dp-70 "${gpt[@]}" --solver offload-dp --budget 70%       # issue 11
    ((SECONDS > ${DEADLINE:-100000})) && exit 0
    timeout "${RUN_TIMEOUT:-120}" "$bin" bench "${model[@]}" --profile h100 --device "$device" --steps 4 | tee "$out/bench-gpt.txt" || true
    ;;
*)
    echo "usage: $0 build | run [BIN] | overlap [BIN]" >&2
    exit 2
    ;;
esac
