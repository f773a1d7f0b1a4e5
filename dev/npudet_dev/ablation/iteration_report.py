"""The iteration benchmark's result (:mod:`.iteration_bench`) as a markdown table and a
stacked bar plot of each run's time split. A speed-up taken while either of its runs was
loaded (npudet.benchmark.conditions: the rule) is never shown bare: the table marks it
``loaded`` with its CPU-time speed-up, the plot greys it (and the loaded run's bars) and puts
the CPU-time speed-up beside it."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Tuple

from npudet.benchmark.conditions import (
    LOADED_STYLE,
    LOADED_TEXT,
    RULE,
    legend_handles,
    ratio_cell,
)
from npudet.utils.json_io import write_json_atomic

from .matching import TIE_RTOL
from .time_split import PHASES

PHASE_LABELS = {
    "data": "data",
    "backbone": "backbone + neck",
    "msda_fwd": "MSDA fwd",
    "msda_bwd": "MSDA bwd",
    "loss_assigner": "loss / assigner",
    "transformer_rest": "transformer rest",
    "optimizer": "optimizer",
    "other": "other",
}
PHASE_COLOURS = {
    "data": "#8c564b",
    "backbone": "#1f77b4",
    "msda_fwd": "#d62728",
    "msda_bwd": "#ff9896",
    "loss_assigner": "#2ca02c",
    "transformer_rest": "#9467bd",
    "optimizer": "#bcbd22",
    "other": "#c7c7c7",
}


def header(result: Dict[str, Any]) -> str:
    """One paragraph: what ran, where, and how the numbers are taken."""
    m = result["machine"]
    v = result["versions"]
    timed = result["iters"] - result["warmup"]
    missing = [i for i in result["impls"] if i not in result["runs"]]
    bounds = result.get("loss_bounds", result["loss_rtols"])
    controls = [name for name in result["runs"] if "@" in name]
    widened = (
        f" ({', '.join(f'`{c}`' for c in controls)}: the reference on another thread count, a "
        f"round-off control; the bounds are {result['loss_rtols']} widened to "
        f"{result.get('control_factor', 0):g}x its deviation; controls are not judged)"
        if controls
        else ""
    )
    run_commits = {
        n: r["commit"][:10]
        for n, r in result["runs"].items()
        if r.get("commit", result["commit"]) != result["commit"]
    }
    commits = (
        " Runs added later, at their commits: "
        + ", ".join(f"`{n}` {c}" for n, c in run_commits.items())
        + "."
        if run_commits
        else ""
    )
    rounds = result.get("rounds", 1)
    interleaved = (
        f"{rounds} rounds, the runs interleaved round by round, medians over the {timed} "
        "after each round's warm-up"
        if rounds > 1
        else f"medians over the {timed} after it"
    )
    return (
        f"`{result['config']}`, input {result['input']}, batch {result['batch_size']}, "
        f"{result['iters']} iterations ({result['warmup']} warm-up, {interleaved}), "
        f"seed {result['seed']}. CPU: {m['cpu_model']} "
        f"({', '.join(m['cpu_features'])}), ATen capability {m['aten_capability']}, "
        f"{m['threads']} threads; torch {v['torch']}, mmdet {v['mmdet']}, mmcv {v['mmcv']}; "
        f"commit {result['commit'][:10]}. Times are wall clock but `iter CPU s` (the "
        f"process's CPU time, both threads; on a loaded machine it grows too, if less). "
        f"Speed-up, memory ratio and loss deviation are against `{result['reference']}`; "
        f"losses agree when iteration k's relative deviation is <= "
        f"{', '.join(f'{t:g}' for t in bounds)} for k = 0, 1, ...{widened} (later "
        f"iterations are reported, not judged: npudet_dev.ablation.iteration_bench.LOSS_RTOLS "
        f"says why). {RULE[0].upper() + RULE[1:]} (npudet.benchmark.conditions; runs "
        f"stored without their load are judged by the wall / CPU rule alone): a loaded "
        f"speed-up is shown in parentheses with its CPU-time speed-up beside it."
        + (
            " Hungarian near ties are broken the reference's way (listed below the table)."
            if any("matching_ties" in r for r in result["runs"].values())
            else ""
        )
        + (f" Not run (interrupted): {', '.join(missing)}." if missing else "")
        + commits
    )


def markdown_table(result: Dict[str, Any]) -> str:
    """Rows: runs; columns: iteration time, speed-up, MSDA, the other phases, memory, losses."""
    cols = [
        "impl",
        "iter s",
        "speed-up",
        "iter CPU s",
        "CPU-time speed-up",
        *(f"{PHASE_LABELS[p]} s" for p in PHASES),
        "peak RSS MB",
        "mem ratio",
        "losses",
        "rel. loss dev. per iteration",
        "agree",
        "conditions",
    ]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for impl, s in result["summary"].items():
        losses = " ".join(f"{x:.5f}" for x in result["runs"][impl]["loss"])
        cells: List[str] = [
            f"`{impl}`",
            f"{s['iter_ms'] / 1e3:.1f}",
            ratio_cell(s["speedup"], s["cpu_time_speedup"], s.get("loaded", False)),
            f"{s['iter_cpu_ms'] / 1e3:.1f}",
            f"{s['cpu_time_speedup']:.2f}x",
            *(f"{s['phases_ms'][p] / 1e3:.2f}" for p in PHASES),
            f"{s['peak_rss_mb']:.0f}",
            f"{s['mem_ratio']:.2f}",
            losses,
            " ".join(f"{d:.0e}" for d in s["loss_rel_dev"]),
            "control" if s.get("control") else "yes" if s["losses_agree"] else "**no**",
            conditions_cell(result["runs"][impl], s),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def conditions_cell(run: Dict[str, Any], summary: Dict[str, Any]) -> str:
    """The recorded load of a run's rounds (``load 0.3-0.4``; ``load not recorded``), and
    ``loaded (why)`` or ``quiet``."""
    loads = [r["conditions"]["load_1m"] for r in [run, *run.get("rounds", [])] if "conditions" in r]
    load = ", ".join("load " + "-".join(f"{v:.1f}" for v in pair) for pair in loads)
    state = f"loaded ({summary['loaded_why']})" if summary.get("loaded") else "quiet"
    return f"{load or 'load not recorded'}; {state}"


def term_deviations(
    result: Dict[str, Any], iteration: int, top: int = 3
) -> Dict[str, List[Tuple[str, float, float]]]:
    """Per run (not the reference), the ``top`` loss terms furthest from the reference's at
    ``iteration``: ``(term, absolute deviation, reference value)``, largest first; runs
    without per-term losses (stored before they were recorded) are left out."""
    ref = result["runs"][result["reference"]].get("loss_terms")
    out: Dict[str, List[Tuple[str, float, float]]] = {}
    if not ref or len(ref) <= iteration:
        return out
    for name, run in result["runs"].items():
        terms = run.get("loss_terms")
        if name == result["reference"] or not terms or len(terms) <= iteration:
            continue
        got, want = terms[iteration], ref[iteration]
        devs = [(k, abs(got[k] - want[k]), want[k]) for k in want if k in got]
        out[name] = sorted(devs, key=lambda d: -d[1])[:top]
    return out


def term_lines(result: Dict[str, Any], iteration: int = 0) -> str:
    """Markdown: where each run's iteration-``iteration`` loss parts from the reference's."""
    devs = term_deviations(result, iteration)
    if not devs:
        return ""
    lines = [
        f"Loss terms furthest from `{result['reference']}`'s at iteration {iteration} "
        "(absolute deviation, the reference's value):",
        "",
    ]
    for name, rows in devs.items():
        parts = ", ".join(f"{k} {d:.1e} (of {v:.4f})" for k, d, v in rows)
        lines.append(f"- `{name}`: {parts}")
    return "\n".join(lines) + "\n"


def matching_lines(result: Dict[str, Any]) -> str:
    """Markdown: per run (not the reference), where its Hungarian matching differed from the
    reference's and whether that was a near tie broken the reference's way (:mod:`.matching`);
    runs stored before matchings were recorded are left out."""
    lines = []
    for name, run in result["runs"].items():
        ties = run.get("matching_ties")
        if name == result["reference"] or ties is None:
            continue
        if not ties:
            lines.append(f"- `{name}`: every matching the reference's")
            continue
        parts = []
        for t in ties:
            calls = len(run["matching"][t["iteration"]])
            outcome = "a tie, the reference's taken" if t["adopted"] else "**not a tie, kept**"
            parts.append(
                f"iteration {t['iteration']}, assigner call {t['call'] + 1} of {calls}: "
                f"{t['queries']} queries, the reference's matching costs {t['rel_gap']:.0e} "
                f"of the total more ({outcome})"
            )
        lines.append(f"- `{name}`: " + "; ".join(parts))
    if not lines:
        return ""
    head = (
        f"Hungarian matchings that differ from `{result['reference']}`'s (a near tie: the "
        f"reference's matching costs at most {TIE_RTOL:g} of the total more under the run's "
        "own costs; ties are broken the reference's way, so the losses compare one matching):"
    )
    return head + "\n\n" + "\n".join(lines) + "\n"


def time_split_figure(result: Dict[str, Any], title: str) -> Any:
    """Median iteration time per run as bars stacked by phase, labelled with the time and the
    speed-up; a loaded run's bars grey and hatched, a loaded speed-up's label grey with the
    CPU-time speed-up beside it. Returns the matplotlib Figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    impls = list(result["summary"])
    summary = result["summary"]
    fig, ax = plt.subplots(figsize=(1.6 * len(impls) + 4, 4.5))
    bottom = [0.0] * len(impls)
    for phase in PHASES:
        values = [max(summary[i]["phases_ms"][phase], 0.0) / 1e3 for i in impls]
        bars = ax.bar(
            impls, values, bottom=bottom, label=PHASE_LABELS[phase], color=PHASE_COLOURS[phase]
        )
        for bar, impl in zip(bars, impls):
            if summary[impl].get("run_loaded"):
                bar.set(**LOADED_STYLE)
        bottom = [b + v for b, v in zip(bottom, values)]
    for x, impl in enumerate(impls):
        s = summary[impl]
        text = f"{s['iter_ms'] / 1e3:.1f} s\n{s['speedup']:.2f}x"
        if s.get("loaded"):
            text = (
                f"{s['iter_ms'] / 1e3:.1f} s\n(wall {s['speedup']:.2f}x: loaded)\n"
                f"CPU-time {s['cpu_time_speedup']:.2f}x"
            )
        colour = LOADED_TEXT if s.get("loaded") else "black"
        ax.text(x, bottom[x], text, ha="center", va="bottom", fontsize=8, color=colour)
    ax.set_ylabel("s per training iteration (median)")
    ax.set_ylim(0, max(bottom + [1e-3]) * 1.3)
    if any(s.get("loaded") for s in summary.values()):
        title += "\ngrey: loaded runs and ratios (CPU-time speed-up beside)"
    ax.set_title(title, fontsize=9)
    colours = {PHASE_LABELS[p]: PHASE_COLOURS[p] for p in PHASES}
    handles = legend_handles(colours, any(s.get("run_loaded") for s in summary.values()))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def plot_time_split(result: Dict[str, Any], path: str, title: str) -> None:
    """:func:`time_split_figure`, saved to ``path``."""
    import matplotlib.pyplot as plt

    fig = time_split_figure(result, title)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(result: Dict[str, Any], json_path: str) -> None:
    """``json_path``, and next to it ``<stem>.md`` (header + table) and ``<stem>_split.png``."""
    write_json_atomic(json_path, result)
    stem = os.path.splitext(json_path)[0]
    with open(stem + ".md", "w") as f:
        notes = [n for n in (term_lines(result), matching_lines(result)) if n]
        f.write(f"{header(result)}\n\n{markdown_table(result)}" + "".join(f"\n{n}" for n in notes))
    name = os.path.splitext(os.path.basename(result["config"]))[0]
    plot_time_split(result, stem + "_split.png", f"{name}\ntime per iteration, {result['input']}")


def write_json_and_table(result: Dict[str, Any], json_path: str, table: str) -> str:
    """Write ``result`` to ``json_path`` (its folder made) and ``table`` to the ``.md`` beside;
    returns the table."""
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    write_json_atomic(json_path, result)
    with open(os.path.splitext(json_path)[0] + ".md", "w") as f:
        f.write(table)
    return table
