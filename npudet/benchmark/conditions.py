"""Under which conditions a timing was taken, and whether a ratio of two timings is fair.

A wall-clock time on a shared machine counts the other processes' turns on the cores. Every
benchmark tool (``tools/analysis_tools/benchmark_msda.py``, ``dev/tools/bench_iteration.py``,
``tools/analysis_tools/ablate.py``, ``dev/tools/bench_deploy.py``) runs its implementations
interleaved round by round and records per timed run (:class:`Recorder`): the machine's 1-minute
load average before and after, the CPU time of this process and of its waited-for children, the wall
time and the threads the work used. One rule (:func:`loaded_reasons`) says when a run was *loaded*:

- **load**: ``max(load before, load after) > threads + LOAD_MARGIN``: more runnable threads
  than the run's own, so others wanted cores while it ran (the load average counts the run's
  own threads too); or
- **starved**: ``wall > STARVED_FACTOR x CPU time`` (CPU-bound work only): a CPU-bound run alone
  on its cores accrues at least one CPU second per wall second, whatever its thread count;
  well below that, it waited for a core. This is the rule that judges stored runs without a
  recorded load, and a second sign for new ones (those of ``STARVED_MIN_WALL_S`` or more).

A ratio of two runs is loaded when either run is (:func:`ratio_reasons`); tables, JSON and
plots mark it ``loaded`` and show the CPU-time ratio beside the wall-time one.
"""

from __future__ import annotations

import os
import resource
import time
from typing import Dict, List, Optional, Sequence

LOAD_MARGIN = 0.5
STARVED_FACTOR = 1.3
# A recorded run shorter than this is judged by its load alone: over a few milliseconds the
# CPU-time and wall clocks disagree by scheduling noise, not by waiting for a core.
STARVED_MIN_WALL_S = 1.0
# The rule in words, for the headers of tables and JSON files.
RULE = (
    f"loaded: the 1-minute load average before or after a run above its threads + "
    f"{LOAD_MARGIN:g}, or its wall time above {STARVED_FACTOR:g}x its CPU time; a ratio is "
    "loaded when either of its runs is"
)


def load_1m() -> float:
    """The machine's 1-minute load average (NaN where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def cpu_seconds(children: bool = False) -> float:
    """CPU time (user + system, all threads) of this process, or of its waited-for children."""
    if not children:
        return time.process_time()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Recorder:
    """Context manager recording one timed run's conditions as a dict (:attr:`record`):
    ``load_1m`` [before, after], ``cpu_s`` (this process's, plus its children's where
    ``children``), ``wall_s``, ``threads`` and ``cpu_bound`` (False where the work waits on a
    device: the starved rule then does not apply)."""

    def __init__(self, threads: int, children: bool = False, cpu_bound: bool = True) -> None:
        self.threads, self.children, self.cpu_bound = threads, children, cpu_bound
        self.record: Dict[str, object] = {}

    def _cpu(self) -> float:
        return cpu_seconds() + (cpu_seconds(children=True) if self.children else 0.0)

    def __enter__(self) -> Recorder:
        self._load = load_1m()
        self._cpu0 = self._cpu()
        self._wall0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.perf_counter() - self._wall0
        self.record = {
            "load_1m": [round(self._load, 2), round(load_1m(), 2)],
            "cpu_s": round(self._cpu() - self._cpu0, 4),
            "wall_s": round(wall, 4),
            "threads": self.threads,
            "cpu_bound": self.cpu_bound,
        }


def loaded_reasons(
    threads: int,
    load: Optional[Sequence[float]] = None,
    wall_s: Optional[float] = None,
    cpu_s: Optional[float] = None,
    cpu_bound: bool = True,
) -> List[str]:
    """Why a run was loaded (empty: it was not, as far as what was recorded tells): the load
    rule on ``load`` (1-minute averages around the run) and ``threads``, the starved rule on
    ``wall_s`` and ``cpu_s`` (any one unit) when ``cpu_bound``; None skips a rule."""
    reasons = []
    peak = max((v for v in load or () if v == v), default=None)
    if peak is not None and peak > threads + LOAD_MARGIN:
        reasons.append(f"load {peak:.1f} > {threads} threads + {LOAD_MARGIN:g}")
    if cpu_bound and wall_s and cpu_s is not None and wall_s > STARVED_FACTOR * cpu_s:
        reasons.append(f"wall {wall_s / max(cpu_s, 1e-12):.1f}x CPU time")
    return reasons


def record_reasons(record: Optional[Dict[str, object]]) -> List[str]:
    """:func:`loaded_reasons` of a :class:`Recorder` record (empty for None: not recorded);
    the starved rule only from ``STARVED_MIN_WALL_S`` of wall time on."""
    if not record:
        return []
    long_enough = (record.get("wall_s") or 0.0) >= STARVED_MIN_WALL_S
    return loaded_reasons(
        int(record["threads"]),
        record.get("load_1m"),
        record.get("wall_s"),
        record.get("cpu_s"),
        bool(record.get("cpu_bound", True)) and long_enough,
    )


def ratio_reasons(runs: Dict[str, List[str]]) -> List[str]:
    """The reasons of a ratio between the runs named in ``runs`` (name -> its reasons): every
    run's, each prefixed by its name; empty when no run was loaded."""
    return [f"{name}: {why}" for name, reasons in runs.items() for why in reasons]


def mark(reasons: Sequence[str]) -> Dict[str, object]:
    """``{"loaded": bool, "loaded_why": "; ".join(reasons)}``: the JSON fields of a ratio."""
    return {"loaded": bool(reasons), "loaded_why": "; ".join(reasons)}


def ratio_cell(wall_x: float, cpu_x: Optional[float], loaded: bool, fmt: str = ".2f") -> str:
    """A table cell of a speed-up: the wall-time ratio, or for a loaded one the wall ratio in
    parentheses marked ``loaded`` with the CPU-time ratio beside it."""
    if not loaded:
        return f"{wall_x:{fmt}}x"
    cpu = f", CPU-time {cpu_x:{fmt}}x" if cpu_x is not None and cpu_x == cpu_x else ""
    return f"({wall_x:{fmt}}x) loaded{cpu}"


# How a loaded row is drawn in every plot: grey, hatched, its label grey.
LOADED_STYLE = {"facecolor": "#bdbdbd", "hatch": "//", "edgecolor": "#7f7f7f"}
LOADED_TEXT = "#7f7f7f"


def legend_handles(colours: Dict[str, str], any_loaded: bool) -> List[object]:
    """Legend patches of a plot's series (label -> colour), and of a loaded run where the
    plot has one (its bars take the loaded style, so the bars cannot stand for the series)."""
    from matplotlib.patches import Patch

    handles = [Patch(color=colour, label=label) for label, colour in colours.items()]
    if any_loaded:
        handles.append(Patch(label="loaded run", **LOADED_STYLE))
    return handles
