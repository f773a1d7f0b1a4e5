"""Plot a ``tools/benchmark_msda.py --json`` file (or ``tools/check_device.py --json``'s
benchmark): speed-up over ``grid_sample`` per case and implementation, one panel per ratio
(default forward, backward, forward+backward; log scale).

    python tools/plot_benchmark.py results/msda_cpu_2threads.json \
        results/msda_cpu_2threads_speedup.png

    python tools/plot_benchmark.py results/device/check_cuda_h200.json \
        results/device/check_cuda_h200_speedup.png --panels fwd_bwd_x,queued_x,kernel_x

The figures are the JSON's own ratios (``fwd_x``, ``bwd_x``, ``fwd_bwd_x``); nothing is
re-measured.
"""

from __future__ import annotations

import argparse
import json
from typing import Dict, List

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LABELS = {
    "fwd_x": "forward",
    "bwd_x": "backward",
    "fwd_bwd_x": "forward+backward",
    "queued_x": "forward+backward, queued",
    "kernel_x": "forward+backward, GPU time",
}
DEFAULT_PANELS = "fwd_x,bwd_x,fwd_bwd_x"


def load(path: str, keys: List[str]) -> List[Dict]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if isinstance(data, dict):
        rows = data["benchmark"]["rows"] if "benchmark" in data else data["results"]
    else:
        rows = data
    return [r for r in rows if all(isinstance(r.get(key), (int, float)) for key in keys)]


def plot(rows: List[Dict], out: str, title: str, keys: List[str]) -> None:
    panels = [(key, LABELS.get(key, key)) for key in keys]
    cases = list(dict.fromkeys(r["case"] for r in rows))
    impls = [i for i in dict.fromkeys(r["impl"] for r in rows) if i != "grid_sample"]
    cell = {(r["case"], r["impl"]): r for r in rows}
    width = 0.8 / max(len(impls), 1)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), sharey=True)
    for ax, (key, label) in zip(axes, panels):
        for k, impl in enumerate(impls):
            xs = [c + (k - (len(impls) - 1) / 2) * width for c in range(len(cases))]
            ys = [cell[(case, impl)][key] if (case, impl) in cell else 0.0 for case in cases]
            ax.bar(xs, ys, width, label=impl)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_title(label)
        ax.set_xticks(range(len(cases)))
        ax.set_xticklabels(cases, rotation=30, ha="right", fontsize=8)
        ax.grid(axis="y", which="both", alpha=0.3)
    axes[0].set_ylabel("speed-up over grid_sample (x, log scale)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(impls), fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", help="a tools/benchmark_msda.py --json file")
    parser.add_argument("png", help="the plot to write")
    parser.add_argument("--panels", default=DEFAULT_PANELS, help="ratio keys, one panel each")
    parser.add_argument("--title", default=None)
    args = parser.parse_args()
    keys = args.panels.split(",")
    rows = load(args.json, keys)
    if not rows:
        raise SystemExit(f"{args.json}: no rows with {', '.join(keys)}")
    plot(rows, args.png, args.title or f"{args.json}: speed-up over grid_sample", keys)
    print(f"wrote {args.png} ({len(rows)} rows)")


if __name__ == "__main__":
    main()
