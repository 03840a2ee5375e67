"""The head-to-head benchmark's points as one SVG chart: step-time overhead over eager
against the measured peak (a share of eager's), one series per method.

    python3 crates/python/bench/chart.py docs/head_to_head_gpt2_cpu.json docs/head_to_head_gpt2_cpu.svg

Plain SVG written here (no plotting library in the benchmark's venv); refuses to
overwrite the output unless `--force`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

COLORS = {"pebble": "#d62728", "checkpoint": "#1f77b4", "sac": "#2ca02c", "compile": "#9467bd", "eager": "#000000"}
W, H, LEFT, RIGHT, TOP, BOTTOM = 640, 420, 70, 150, 40, 50


def series(points: list[dict[str, Any]]) -> dict[str, list[tuple[float, float, str]]]:
    """(peak / eager's, overhead in %, setting) of each method's points, by peak."""
    eager = next(p for p in points if p["method"] == "eager")
    out: dict[str, list[tuple[float, float, str]]] = {}
    for p in points:
        x = p["peak_bytes"] / eager["peak_bytes"]
        # Measured beside eager's steps where the file has it (since 2026-12-07).
        y = 100 * p["overhead"] if "overhead" in p else 100 * (p["step_seconds"] / eager["step_seconds"] - 1)
        out.setdefault(p["method"], []).append((x, y, p.get("setting", "")))
    return {m: sorted(v) for m, v in out.items()}


def svg(title: str, data: dict[str, list[tuple[float, float, str]]]) -> str:
    xs = [x for v in data.values() for x, _, _ in v]
    ys = [y for v in data.values() for _, y, _ in v]
    x0, x1 = 0.0, max(1.2, max(xs) * 1.05)
    y0, y1 = min(0.0, min(ys) - 2), max(ys) * 1.1 + 2
    px = lambda x: LEFT + (x - x0) / (x1 - x0) * (W - LEFT - RIGHT)  # noqa: E731
    py = lambda y: H - BOTTOM - (y - y0) / (y1 - y0) * (H - TOP - BOTTOM)  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2 - RIGHT / 2}" y="22" text-anchor="middle" font-size="14">{title}</text>']
    for k in range(6):  # grid and ticks
        x, y = x0 + k * (x1 - x0) / 5, y0 + k * (y1 - y0) / 5
        out.append(f'<line x1="{px(x):.1f}" y1="{TOP}" x2="{px(x):.1f}" y2="{H - BOTTOM}" stroke="#ddd"/>')
        out.append(f'<text x="{px(x):.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">{x:.2f}</text>')
        out.append(f'<line x1="{LEFT}" y1="{py(y):.1f}" x2="{W - RIGHT}" y2="{py(y):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.0f}%</text>')
    out.append(f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 12}" text-anchor="middle">measured peak / eager\'s</text>')
    out.append(f'<text transform="translate(18,{(TOP + H - BOTTOM) / 2}) rotate(-90)" text-anchor="middle">'
               'step-time overhead over eager</text>')
    for i, (method, pts) in enumerate(sorted(data.items())):
        color = COLORS.get(method, "#7f7f7f")
        if len(pts) > 1:
            path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y, _ in pts)
            out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.5"/>')
        for x, y, setting in pts:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" fill="{color}"><title>{method} {setting}: '
                       f'{x:.2f}x, {y:+.1f}%</title></circle>')
        ly = TOP + 10 + 18 * i
        out.append(f'<circle cx="{W - RIGHT + 16}" cy="{ly}" r="4" fill="{color}"/>')
        out.append(f'<text x="{W - RIGHT + 26}" y="{ly + 4}">{method}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("points", type=Path, help="head_to_head.py's --out JSON")
    ap.add_argument("out", type=Path, help="the SVG to write")
    ap.add_argument("--force", action="store_true", help="overwrite the SVG if it exists")
    a = ap.parse_args()
    if a.out.exists() and not a.force:
        sys.exit(f"chart: {a.out} exists (give --force to overwrite it)")
    run = json.loads(a.points.read_text())
    title = f"{run['model']} on {run['device']} (torch {run['torch']})"
    a.out.write_text(svg(title, series(run["points"])))


if __name__ == "__main__":
    main()
