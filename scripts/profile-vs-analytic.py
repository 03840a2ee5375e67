#!/usr/bin/env python3
"""Compares a profiled training graph (`pebble profile -o P`) with the zoo's analytic one
(`pebble graph -o A`) of the same model: total time, time by op kind, temporary bytes.

    python3 scripts/profile-vs-analytic.py P A
"""
import json
import sys
from collections import defaultdict

prof, ana = (json.load(open(p)) for p in sys.argv[1:3])
assert len(prof["compute"]) == len(ana["compute"]), "not the same model"
by_kind = defaultdict(lambda: [0.0, 0.0])
tmp = [0, 0]
for p, a in zip(prof["compute"], ana["compute"]):
    key = (p.get("op") or "?") + ("" if p["kind"] == "forward" else f" ({p['kind']})")
    by_kind[key][0] += p["time"]
    by_kind[key][1] += a["time"]
    tmp[0] += p.get("tmp", 0)
    tmp[1] += a.get("tmp", 0)
total = [sum(v[0] for v in by_kind.values()), sum(v[1] for v in by_kind.values())]
print("| op | profiled | share | analytic | share | ratio |\n|---|---|---|---|---|---|")
for k, (p, a) in sorted(by_kind.items(), key=lambda kv: -kv[1][0]):
    ratio = f"{p / a:.0f}×" if a else "-"
    print(f"| {k} | {p * 1e3:.2f} ms | {100 * p / total[0]:.1f}% | {a * 1e3:.3f} ms | {100 * a / total[1]:.1f}% | {ratio} |")
print(f"| **all** | {total[0] * 1e3:.1f} ms | 100% | {total[1] * 1e3:.2f} ms | 100% | {total[0] / total[1]:.0f}× |")
print(f"\ntemporary bytes summed over nodes: profiled {tmp[0] / 2**20:.1f} MiB, analytic {tmp[1] / 2**20:.1f} MiB")
