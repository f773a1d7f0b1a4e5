"""Plot a ``tools/analysis_tools/benchmark_msda.py --json`` file (or
``tools/misc/check_device.py --json``'s benchmark): speed-up over ``grid_sample`` per case and
implementation, one panel per ratio (default forward, backward, forward+backward; log scale).

    python dev/tools/plot_benchmark.py results/msda_cpu_2threads.json \
        results/msda_cpu_2threads_speedup.png

    python dev/tools/plot_benchmark.py results/device/check_cuda_h200.json \
        results/device/check_cuda_h200_speedup.png --panels fwd_bwd_x,queued_x,kernel_x

The figures are the JSON's own ratios (``fwd_x``, ``bwd_x``, ``fwd_bwd_x``); nothing is
re-measured. A row the benchmark marked ``loaded`` is drawn grey and hatched with its CPU-time
ratio (``fwd_cpu_x``, ...) written beside the bar; a file stored before the load was recorded
says so in the title (its implementations were interleaved in one process, so its ratios
shared the machine's conditions, whatever they were).
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Dict, List

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from npudet.benchmark.conditions import (  # noqa: E402
    LOADED_STYLE,
    LOADED_TEXT,
    legend_handles,
)

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


def figure(rows: List[Dict], title: str, keys: List[str]) -> Any:
    """One panel per ratio key, bars per case and implementation (log scale); loaded rows grey
    with their CPU-time ratio beside. Returns the matplotlib Figure."""
    panels = [(key, LABELS.get(key, key)) for key in keys]
    cases = list(dict.fromkeys(r["case"] for r in rows))
    impls = [i for i in dict.fromkeys(r["impl"] for r in rows) if i != "grid_sample"]
    cell = {(r["case"], r["impl"]): r for r in rows}
    width = 0.8 / max(len(impls), 1)
    colours: Dict[str, Any] = {}  # the series' own colours (a loaded bar is grey)
    fig, grid = plt.subplots(
        1, len(panels), figsize=(5.2 * len(panels), 4.2), sharey=True, squeeze=False
    )
    axes = grid[0]
    for ax, (key, label) in zip(axes, panels):
        for k, impl in enumerate(impls):
            xs = [c + (k - (len(impls) - 1) / 2) * width for c in range(len(cases))]
            ys = [cell[(case, impl)][key] if (case, impl) in cell else 0.0 for case in cases]
            bars = ax.bar(xs, ys, width, label=impl)
            colours[impl] = bars[0].get_facecolor()
            for bar, x, y, case in zip(bars, xs, ys, cases):
                row = cell.get((case, impl), {})
                if not row.get("loaded"):
                    continue
                bar.set(**LOADED_STYLE)
                cpu = row.get(key.replace("_x", "_cpu_x"))
                text = f"loaded\nCPU {cpu:.1f}x" if isinstance(cpu, (int, float)) else "loaded"
                ax.text(x, y, text, ha="center", va="bottom", fontsize=6, color=LOADED_TEXT)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_ylim(top=ax.get_ylim()[1] * 2)  # room for the labels of loaded bars
        ax.set_title(label)
        ax.set_xticks(range(len(cases)))
        ax.set_xticklabels(cases, rotation=30, ha="right", fontsize=8)
        ax.grid(axis="y", which="both", alpha=0.3)
    axes[0].set_ylabel("speed-up over grid_sample (x, log scale)")
    handles = legend_handles(colours, any(r.get("loaded") for r in rows))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8)
    if not any("loaded" in r for r in rows):
        title += "\n(load not recorded; implementations interleaved in one process)"
    elif any(r.get("loaded") for r in rows):
        title += "\ngrey: loaded (CPU-time ratio beside)"
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def plot(rows: List[Dict], out: str, title: str, keys: List[str]) -> None:
    """:func:`figure`, saved to ``out``."""
    fig = figure(rows, title, keys)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", help="a tools/analysis_tools/benchmark_msda.py --json file")
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
