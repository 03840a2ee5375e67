#!/usr/bin/env python3
"""Rotor against the best `checkpoint_sequential` at equal memory, in simulation.

Shilova's thesis (§2.4.5) measured on a V100 that Rotor's persistent DP gives +12.8%
throughput on average over the best `sequential` segment count, at the corresponding
memory, on ResNet, DenseNet and Inception-v3. This script reproduces the comparison on
pebble's roofline costs: for each network and setting it sweeps 10 budgets between the
least memory any baseline needs and the store-all peak, and averages
time(sequential) / time(rotor) - 1 over the budgets where both fit.

Usage: scripts/rotor-vs-sequential.py [path/to/pebble]   (default: target/release/pebble)
"""
import json
import subprocess
import sys

PEBBLE = sys.argv[1] if len(sys.argv) > 1 else "target/release/pebble"

SETTINGS = [
    (model, image, batch)
    for model in ["resnet18", "resnet50", "resnet101", "resnet152", "densenet121", "densenet201"]
    for (image, batch) in [(224, 32), (500, 8), (1000, 2)]
] + [("inception_v3", 299, 32), ("inception_v3", 500, 8)]


def sweep(model, image, batch):
    out = subprocess.run(
        [PEBBLE, "sweep", "--model", model, "--image", str(image), "--batch", str(batch),
         "--solvers", "rotor,sequential", "--points", "10", "--json"],
        check=True, capture_output=True, text=True).stdout
    by_solver = {s["solver"]: s["points"] for s in json.loads(out)["solvers"]}
    gains = []
    for r, s in zip(by_solver["rotor"], by_solver["sequential"]):
        if r["feasible"] and s["feasible"]:
            gains.append(s["predicted_time"] / r["predicted_time"] - 1)
    return gains


all_gains = []
print(f"{'model':14} {'image':>5} {'batch':>5} {'points':>6} {'mean gain':>9} {'max gain':>8}")
for model, image, batch in SETTINGS:
    g = sweep(model, image, batch)
    all_gains += g
    if g:
        print(f"{model:14} {image:5} {batch:5} {len(g):6} {100 * sum(g) / len(g):8.1f}% {100 * max(g):7.1f}%")
print(f"average throughput gain of rotor over the best sequential: "
      f"{100 * sum(all_gains) / len(all_gains):.1f}% over {len(all_gains)} budget points")
