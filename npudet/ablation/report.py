"""Ablation records -> a table (markdown, CSV) and two plots (loss curves, time split)."""

from __future__ import annotations

import csv
import statistics
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence, Tuple

COLUMNS = (
    ("variant", "variant"),
    ("encoder", "encoder"),
    ("decoder", "decoder"),
    ("iter_ms", "iter ms (median)"),
    ("speedup", "speed-up"),
    ("msda_fwd_ms", "MSDA fwd ms"),
    ("msda_bwd_ms", "MSDA bwd ms"),
    ("msda_share", "MSDA share %"),
    ("peak_mem_mb", "peak mem MB"),
    ("final_loss", "final loss"),
    ("max_loss_dev", "max abs loss dev."),
    ("max_rel_loss_dev", "max rel. dev."),
)
# Shown when the variants also ran with the forward compiled (``tools/ablate.py --compile``).
COMPILED_COLUMNS = (
    ("compiled_iter_ms", "compiled iter ms"),
    ("compiled_speedup", "compiled vs eager"),
    ("compiled_rel_dev", "compiled max rel. dev."),
    ("graph_breaks", "graph breaks"),
)


@dataclass
class Row:
    """One variant's figures; times are medians over the iterations after warm-up."""

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
        )
        if compiled is not None:
            done = compiled[label]
            row.compiled_iter_ms = _median_iter_ms(done, warmup)
            row.compiled_speedup = row.iter_ms / row.compiled_iter_ms
            row.compiled_rel_dev = max(_rel_devs(done[0]["loss"], loss)[1])
            row.graph_breaks = max(rec["graph_breaks"] for rec in done)
        rows.append(row)
    for row in rows:
        row.speedup = rows[0].iter_ms / row.iter_ms if row.iter_ms > 0 else 0.0
    return rows


def _columns(rows: Sequence[Row]) -> Tuple[Tuple[str, str], ...]:
    compiled = any(row.compiled_iter_ms is not None for row in rows)
    return COLUMNS + COMPILED_COLUMNS if compiled else COLUMNS


def _fmt(key: str, value: object) -> str:
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return str(value)
    if key in ("max_loss_dev", "max_rel_loss_dev", "compiled_rel_dev"):
        return f"{value:.2e}"
    if key in ("speedup", "compiled_speedup"):
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
        lines.append("| " + " | ".join(_fmt(k, values[k]) for k, _ in columns) + " |")
    return "\n".join(lines) + "\n"


def write_csv(rows: Sequence[Row], path: str) -> None:
    """The rows as CSV with the field names of :class:`Row` as header."""
    with open(path, "w", newline="") as f:
        fields = [k for k, _ in _columns(rows)]
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


def plot_time_split(rows: Sequence[Row], path: str, title: str) -> None:
    """Median iteration time per variant as stacked bars: MSDA fwd, MSDA bwd, the rest."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [row.variant for row in rows]
    fwd = [row.msda_fwd_ms for row in rows]
    bwd = [row.msda_bwd_ms for row in rows]
    rest = [max(row.iter_ms - f - b, 0.0) for row, f, b in zip(rows, fwd, bwd)]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(labels, fwd, label="MSDA forward", color="#d62728")
    ax.bar(labels, bwd, bottom=fwd, label="MSDA backward", color="#ff9896")
    ax.bar(labels, rest, bottom=[f + b for f, b in zip(fwd, bwd)], label="rest", color="#7f7f7f")
    for i, row in enumerate(rows):
        ax.text(i, row.iter_ms, f"{row.iter_ms:.0f} ms", ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("ms per training iteration (median)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
