"""Ablation records -> a table (markdown, CSV) and two plots (loss curves, time split).

A speed-up whose runs were loaded (npudet.benchmark.conditions: the rule) is marked
``loaded`` in the table and the CSV, shown with its CPU-time ratio, and greyed in the plot.
"""

from __future__ import annotations

import csv
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from npudet.benchmark.conditions import (
    LOADED_STYLE,
    LOADED_TEXT,
    legend_handles,
    loaded_reasons,
    ratio_cell,
    ratio_reasons,
)

COLUMNS = (
    ("variant", "variant"),
    ("encoder", "encoder"),
    ("decoder", "decoder"),
    ("iter_ms", "iter ms (median)"),
    ("speedup", "speed-up"),
    ("iter_cpu_ms", "iter CPU ms"),
    ("cpu_time_speedup", "CPU-time speed-up"),
    ("msda_fwd_ms", "MSDA fwd ms"),
    ("msda_bwd_ms", "MSDA bwd ms"),
    ("msda_share", "MSDA share %"),
    ("peak_mem_mb", "peak mem MB"),
    ("final_loss", "final loss"),
    ("max_loss_dev", "max abs loss dev."),
    ("max_rel_loss_dev", "max rel. dev."),
    ("loaded_why", "conditions"),
)
# Shown when the variants also ran with the forward compiled (``tools/analysis_tools/ablate.py
# --compile``).
COMPILED_COLUMNS = (
    ("compiled_iter_ms", "compiled iter ms"),
    ("compiled_speedup", "compiled vs eager"),
    ("compiled_rel_dev", "compiled max rel. dev."),
    ("graph_breaks", "graph breaks"),
)


@dataclass
class Row:
    """One variant's figures; times are medians over the iterations after warm-up.
    ``loaded`` / ``loaded_why``: its speed-up's (either run loaded); ``run_loaded``: its own."""

    variant: str
    encoder: str
    decoder: str
    iter_ms: float
    speedup: float
    msda_fwd_ms: float
    msda_bwd_ms: float
    msda_share: float
    peak_mem_mb: float
    final_loss: float
    max_loss_dev: float
    max_rel_loss_dev: float
    iter_cpu_ms: float = float("nan")
    cpu_time_speedup: float = float("nan")
    loaded: bool = False
    loaded_why: str = ""
    run_loaded: bool = False
    compiled_iter_ms: Optional[float] = None
    compiled_speedup: Optional[float] = None
    compiled_rel_dev: Optional[float] = None
    graph_breaks: Optional[int] = None


def _kept(values: Sequence[float], warmup: int) -> List[float]:
    return list(values[warmup:]) if len(values) > warmup else list(values)


def _rel_devs(loss: Sequence[float], base: Sequence[float]) -> Tuple[List[float], List[float]]:
    """Absolute and relative deviations of ``loss`` from ``base``, iteration by iteration."""
    devs = [abs(a - b) for a, b in zip(loss, base)]
    return devs, [d / max(abs(b), 1e-12) for d, b in zip(devs, base)]


def _median_iter_ms(records: List[Dict], warmup: int) -> float:
    return statistics.median(v for rec in records for v in _kept(rec["iter_ms"], warmup))


def _median_cpu_ms(records: List[Dict], warmup: int) -> float:
    """The pooled median CPU ms per iteration; NaN for records without it (stored before)."""
    values = [v for rec in records for v in _kept(rec.get("iter_cpu_ms") or [], warmup)]
    return statistics.median(values) if values else float("nan")


def run_reasons(records: List[Dict[str, Any]], warmup: int) -> List[str]:
    """Why a variant's runs were loaded: the load rule on each run's recorded ``conditions``,
    the starved rule on its median iteration wall and CPU times (where recorded)."""
    reasons: List[str] = []
    for rec in records:
        cond = rec.get("conditions") or {}
        cpu = _median_cpu_ms([rec], warmup)
        found = loaded_reasons(
            int(cond.get("threads", rec.get("threads", 1))),
            cond.get("load_1m"),
            _median_iter_ms([rec], warmup),
            cpu if cpu == cpu else None,
            bool(cond.get("cpu_bound", rec.get("device", "cpu") == "cpu")),
        )
        reasons += [r for r in found if r not in reasons]
    return reasons


def summarise(
    runs: Dict[str, List[Dict]],
    parts: Dict[str, Dict[str, str]],
    warmup: int,
    compiled: Optional[Dict[str, List[Dict]]] = None,
) -> List[Row]:
    """Rows for ``runs`` (variant label -> list of records, one per round; the first
    variant is the baseline). Times pool the iterations after ``warmup`` of all rounds;
    losses come from the first round, compared iteration by iteration with the
    baseline's. ``compiled`` (same keys: the runs with the forward compiled) adds each
    variant's compiled iteration time, its speed-up over the eager run, its loss
    deviation from the eager run and its graph-break reports."""
    labels = list(runs)
    base_loss = runs[labels[0]][0]["loss"]
    rows: List[Row] = []
    for label in labels:
        records = runs[label]
        pooled = {
            key: [v for rec in records for v in _kept(rec[key], warmup)]
            for key in ("iter_ms", "msda_fwd_ms", "msda_bwd_ms")
        }
        shares = [
            100.0 * (f + b) / it
            for rec in records
            for it, f, b in zip(
                _kept(rec["iter_ms"], warmup),
                _kept(rec["msda_fwd_ms"], warmup),
                _kept(rec["msda_bwd_ms"], warmup),
            )
            if it > 0
        ]
        loss = records[0]["loss"]
        devs, rel = _rel_devs(loss, base_loss)
        row = Row(
            variant=label,
            encoder=parts[label]["encoder"],
            decoder=parts[label]["decoder"],
            iter_ms=statistics.median(pooled["iter_ms"]),
            speedup=0.0,
            msda_fwd_ms=statistics.median(pooled["msda_fwd_ms"]),
            msda_bwd_ms=statistics.median(pooled["msda_bwd_ms"]),
            msda_share=statistics.median(shares) if shares else 0.0,
            peak_mem_mb=max(rec["peak_mem_mb"] for rec in records),
            final_loss=loss[-1],
            max_loss_dev=max(devs),
            max_rel_loss_dev=max(rel),
            iter_cpu_ms=_median_cpu_ms(records, warmup),
        )
        if compiled is not None:
            done = compiled[label]
            row.compiled_iter_ms = _median_iter_ms(done, warmup)
            row.compiled_speedup = row.iter_ms / row.compiled_iter_ms
            row.compiled_rel_dev = max(_rel_devs(done[0]["loss"], loss)[1])
            row.graph_breaks = max(rec["graph_breaks"] for rec in done)
        rows.append(row)
    base_reasons = run_reasons(runs[labels[0]], warmup)
    for label, row in zip(labels, rows):
        row.speedup = rows[0].iter_ms / row.iter_ms if row.iter_ms > 0 else 0.0
        row.cpu_time_speedup = rows[0].iter_cpu_ms / row.iter_cpu_ms
        own = run_reasons(runs[label], warmup)
        why = ratio_reasons({labels[0]: base_reasons, label: own})
        row.loaded, row.loaded_why = bool(why), "; ".join(dict.fromkeys(why))
        row.run_loaded = bool(own)
    return rows


def _columns(rows: Sequence[Row]) -> Tuple[Tuple[str, str], ...]:
    compiled = any(row.compiled_iter_ms is not None for row in rows)
    return COLUMNS + COMPILED_COLUMNS if compiled else COLUMNS


def _fmt(key: str, value: object) -> str:
    if key == "loaded_why":
        return f"loaded ({value})" if value else "quiet"
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return str(value)
    if key in ("max_loss_dev", "max_rel_loss_dev", "compiled_rel_dev"):
        return f"{value:.2e}"
    if key in ("speedup", "compiled_speedup", "cpu_time_speedup"):
        return f"{value:.2f}x"
    if key == "final_loss":
        return f"{value:.4f}"
    return f"{value:.1f}"


def markdown_table(rows: Sequence[Row]) -> str:
    """The rows as a GitHub markdown table."""
    columns = _columns(rows)
    lines = [
        "| " + " | ".join(title for _, title in columns) + " |",
        "|" + "|".join("---" for _ in columns) + "|",
    ]
    for row in rows:
        values = asdict(row)
        cells = [
            ratio_cell(row.speedup, row.cpu_time_speedup, row.loaded)
            if k == "speedup"
            else _fmt(k, values[k])
            for k, _ in columns
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_csv(rows: Sequence[Row], path: str) -> None:
    """The rows as CSV with the field names of :class:`Row` as header."""
    with open(path, "w", newline="") as f:
        fields = [k for k, _ in _columns(rows)] + ["loaded"]
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            values = asdict(row)
            writer.writerow({k: values[k] for k in fields})


def plot_loss_curves(runs: Dict[str, List[Dict]], path: str, title: str) -> None:
    """Training loss per iteration of every variant (first round), overlaid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    styles = ["-", "--", ":", "-."]
    for i, (label, records) in enumerate(runs.items()):
        loss = records[0]["loss"]
        ax.plot(range(1, len(loss) + 1), loss, styles[i % len(styles)], label=label, lw=1.5)
    ax.set_xlabel("iteration")
    ax.set_ylabel("training loss")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def time_split_figure(rows: Sequence[Row], title: str) -> Any:
    """Median iteration time per variant as stacked bars (MSDA fwd, MSDA bwd, the rest), each
    labelled with its time and speed-up; a loaded run's bars grey and hatched, a loaded
    speed-up's label grey with the CPU-time speed-up beside the wall-time one. Returns the
    matplotlib Figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [row.variant for row in rows]
    parts = {
        "MSDA forward": ([row.msda_fwd_ms for row in rows], "#d62728"),
        "MSDA backward": ([row.msda_bwd_ms for row in rows], "#ff9896"),
        "rest": ([max(r.iter_ms - r.msda_fwd_ms - r.msda_bwd_ms, 0.0) for r in rows], "#7f7f7f"),
    }
    fig, ax = plt.subplots(figsize=(7, 4))
    bottom = [0.0] * len(rows)
    for name, (values, colour) in parts.items():
        bars = ax.bar(labels, values, bottom=bottom, label=name, color=colour)
        for bar, row in zip(bars, rows):
            if row.run_loaded:
                bar.set(**LOADED_STYLE)
        bottom = [b + v for b, v in zip(bottom, values)]
    for i, row in enumerate(rows):
        text = f"{row.iter_ms:.0f} ms\n{row.speedup:.2f}x"
        if row.loaded:
            text = f"{row.iter_ms:.0f} ms\n(wall {row.speedup:.2f}x: loaded)\nCPU-time "
            text += f"{row.cpu_time_speedup:.2f}x"
        colour = LOADED_TEXT if row.loaded else "black"
        ax.text(i, row.iter_ms, text, ha="center", va="bottom", fontsize=8, color=colour)
    ax.set_ylabel("ms per training iteration (median)")
    ax.set_ylim(0, max(bottom + [1.0]) * 1.35)
    grey = "\ngrey: loaded (the CPU-time speed-up beside)" if any(r.loaded for r in rows) else ""
    ax.set_title(title + grey)
    colours = {name: colour for name, (_, colour) in parts.items()}
    ax.legend(handles=legend_handles(colours, any(r.run_loaded for r in rows)), fontsize=8)
    fig.tight_layout()
    return fig


def plot_time_split(rows: Sequence[Row], path: str, title: str) -> None:
    """:func:`time_split_figure`, saved to ``path``."""
    import matplotlib.pyplot as plt

    fig = time_split_figure(rows, title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
