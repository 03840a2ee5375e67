#!/usr/bin/env bash
# Step time of the offloading solvers on real tensors, measured against simulated
# (issue 11; docs/benchmarks.md, "Offloading plans on real tensors"). Each run profiles the
# ops on this CPU (COSTS: `profiled` by default, or `steps`), plans on those costs at 85% of
# store-all's activations, caps the device pool at the plan's simulated peak, throttles
# both link directions to the stated rate and runs STEPS steps (10 by default); the step
# time is the median of all but the first. Each line gives the error against the plan's
# prediction (the profile's costs) and against the replay of the same schedule on the
# compute times the run measured (`replayed_time`).
#
#   scripts/offload-step-time.sh [BANDWIDTHS] [SEEDS]    # defaults: "5e8 2e9" "1 2 3"
#   STEPS=6 scripts/offload-step-time.sh                 # the setting before 2026-11-27
set -euo pipefail
cd "$(dirname "$0")/.."
pebble=./target/release/pebble
[ -x "$pebble" ] || cargo build --release -p pebble-cli
bandwidths=${1:-"5e8 2e9"}
seeds=${2:-"1 2 3"}
costs=${COSTS:-profiled}
steps=${STEPS:-10}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for bw in $bandwidths; do
  for model in "mlp --batch 2048" gpt resnet; do
    for solver in offload-dp pofo autocapper; do
      for seed in $seeds; do
        # shellcheck disable=SC2086
        $pebble train --model $model --solver "$solver" --activation-budget 85% \
          --costs "$costs" --bandwidth "$bw" --steps "$steps" --seed "$seed" --json 2>/dev/null |
          python3 -c '
import json, sys, statistics
d = json.load(sys.stdin)
steps = d["step_seconds"][1:]
measured = statistics.median(steps)
sim = d["predicted_time"]
replayed = d["replayed_time"]
print(f"{sys.argv[1]:>4} {sys.argv[2]:<18} {sys.argv[3]:<11} seed {sys.argv[4]}  measured {measured:.3f} s"
      f"  planned {sim:.3f} s {100 * (measured / sim - 1):+6.1f}%  replayed {replayed:.3f} s {100 * (measured / replayed - 1):+6.1f}%")
' "$bw" "$model" "$solver" "$seed"
      done
    done
  done
done | tee "$log"
python3 -c '
import sys, statistics
lines = [l.split() for l in sys.stdin if l.strip()]
for name, col in (("planned", -5), ("replayed", -1)):
    errs = [float(l[col].rstrip("%")) for l in lines]
    within = sum(abs(e) <= 15 for e in errs)
    print(f"{name}: {within} of {len(errs)} runs within 15%; median |error| {statistics.median(abs(e) for e in errs):.1f}%; worst {max(errs, key=abs):+.1f}%")
' < "$log"
