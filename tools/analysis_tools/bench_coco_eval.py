"""Time COCO box evaluation on pycocotools and faster-coco-eval over a generated val set.

Generates COCO-format ground truth and detections (no images; see
npudet.evaluation.coco_synthetic), writes them to a temporary folder, then per backend times
loading the ground truth, ``loadRes``, ``evaluate``, ``accumulate`` and ``summarize`` with
mmdet's CocoMetric settings (maxDets 100/300/1000), and checks both give the same 12 numbers.
"eval" is what mmdet's CocoMetric runs per evaluation: loadRes through summarize. Wall and
CPU seconds are both reported: on a shared machine wall time includes waiting for a core.

    python tools/analysis_tools/bench_coco_eval.py --images 5000
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import sys
import tempfile
import time
from typing import Dict, Iterator, List, Tuple

import numpy as np

from npudet.evaluation import coco_backend
from npudet.evaluation.coco_synthetic import synthetic_coco_gt, synthetic_detections

PHASES = ("load_gt", "load_res", "evaluate", "accumulate", "summarize")
EVAL = PHASES[1:]


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (platform's processor string elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


class _Clock:
    """Wall and CPU (this process, all threads) seconds of each timed phase."""

    def __init__(self) -> None:
        self.wall: Dict[str, float] = {}
        self.cpu: Dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.process_time()
        yield
        self.wall[name] = time.perf_counter() - wall
        self.cpu[name] = time.process_time() - cpu


def time_backend(name: str, gt_file: str, dt_file: str) -> Tuple[_Clock, np.ndarray]:
    """Seconds per phase and the 12 numbers of one backend."""
    backend = coco_backend(name)
    clock = _Clock()
    with open(dt_file) as f:
        dets = json.load(f)
    with contextlib.redirect_stdout(io.StringIO()):
        with clock.phase("load_gt"):
            gt = backend.coco(gt_file)
        with clock.phase("load_res"):
            dt = gt.loadRes(dets)
        evaluator = backend.cocoeval(gt, dt, "bbox")
        evaluator.params.maxDets = [100, 300, 1000]
        for phase in PHASES[2:]:
            with clock.phase(phase):
                getattr(evaluator, phase)()
    return clock, np.asarray(evaluator.stats[:12], dtype=np.float64)


def markdown_table(results: Dict[str, _Clock]) -> str:
    """One row per backend: wall seconds per phase, then eval (loadRes..summarize) wall / CPU."""
    ref = results.get("pycocotools")
    head = "| backend | " + " | ".join(PHASES) + " | eval wall | eval CPU | speed-up (wall) |"
    rows = [head, "|" + "---|" * (len(PHASES) + 4)]
    for name, clock in results.items():
        wall, cpu = (sum(getattr(clock, k)[p] for p in EVAL) for k in ("wall", "cpu"))
        speedup = sum(ref.wall[p] for p in EVAL) / wall if ref else float("nan")
        cells = " | ".join(f"{clock.wall[p]:.2f}" for p in PHASES)
        rows.append(f"| {name} | {cells} | {wall:.2f} | {cpu:.2f} | {speedup:.1f}x |")
    return "\n".join(rows)


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=5000, help="val images to generate")
    parser.add_argument("--classes", type=int, default=80)
    parser.add_argument(
        "--false-positives", type=int, default=90, help="random boxes per image (DETR-like 100)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--backends", nargs="+", default=["pycocotools", "faster_coco_eval"], help="in this order"
    )
    args = parser.parse_args(argv)

    gt = synthetic_coco_gt(args.images, num_classes=args.classes, seed=args.seed)
    dets = synthetic_detections(gt, seed=args.seed + 1, false_positives=args.false_positives)
    print(
        f"{args.images} images, {len(gt['annotations'])} boxes, {len(dets)} detections; "
        f"CPU: {cpu_model()} ({os.cpu_count()} logical cores)"
    )
    results: Dict[str, _Clock] = {}
    stats: Dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        gt_file, dt_file = os.path.join(tmp, "gt.json"), os.path.join(tmp, "dt.json")
        with open(gt_file, "w") as f:
            json.dump(gt, f)
        with open(dt_file, "w") as f:
            json.dump(dets, f)
        for name in args.backends:
            results[name], stats[name] = time_backend(name, gt_file, dt_file)
            wall = results[name].wall
            print(f"{name}: " + ", ".join(f"{p} {wall[p]:.2f}s" for p in PHASES), flush=True)
    print(markdown_table(results))
    first = args.backends[0]
    print(f"12 numbers ({first}): " + " ".join(f"{v:.4f}" for v in stats[first]))
    for name in args.backends[1:]:
        diff = float(np.abs(stats[name] - stats[first]).max())
        print(f"max |{name} - {first}| over the 12 numbers: {diff:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
