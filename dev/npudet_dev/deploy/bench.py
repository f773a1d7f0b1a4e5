"""Per-image inference latency of a detector, route by route, in one run
(``dev/tools/bench_deploy.py``).

Routes (``ROUTES``): PyTorch eager on ``grid_sample`` and on the ``cpu`` kernel, ONNX Runtime
on the GridSample graph and on the fused ``npudet`` node graph (``ort_library()``), and the
AOTInductor package (the fused ``cpu`` kernel inside) loaded by
``torch._inductor.aoti_load_package`` in this process: the C++ runner (``aoti.run_package``)
runs a package once per process and reports no time, so the package's compiled model is
timed through PyTorch's loader, the same ``AOTIModelPackageLoader`` the runner uses.

Every route of a model runs :class:`~npudet.deploy.detector.DetectorGraph` of one model
built from the seed (random weights; pretrained ``init_cfg`` dropped), on the same image
(batch 1). The files are written by ``npudet.deploy.export`` in a child process each
(``tools/export.py``'s path; a time limit stops one cleanly) and kept in the work folder,
reused while the weights, route and traced size are the same. Timing (:func:`time_routes`):
``warmup`` calls of each route, then ``runs`` rounds calling every route once each, interleaved
(A B C, A B C, ...: a change in the machine's load meets every route alike); per route the
median wall and CPU time of its calls, and the conditions of the rounds
(npudet.benchmark.conditions: load average before and after, CPU and wall time, threads),
which mark its speed-ups ``loaded`` when the machine was. Torch's threads and ONNX Runtime's
intra-op threads are both ``threads``. Each route's outputs are compared with eager
``grid_sample``'s (:func:`compare_outputs`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import torch
from mmengine.config import Config
from mmengine.logging import MMLogger

from npudet.benchmark.conditions import RULE, Recorder, mark, record_reasons
from npudet.benchmark.harness import machine_info
from npudet.benchmark.provenance import git_commit
from npudet.deploy.detector import DetectorGraph, example_images, untied
from npudet.deploy.ort_custom_ops import ort_library, ort_session
from npudet.models.detectors import apply_msda_cfg
from npudet.utils.pretrained import drop_pretrained

from .ort_profile import profile_session

ROUTES: Dict[str, str] = {
    "eager_grid_sample": "PyTorch eager, MSDA impl=grid_sample",
    "eager_cpu": "PyTorch eager, MSDA impl=cpu (npudet's fused C++ kernel)",
    "ort_gridsample": "ONNX Runtime, GridSample graph",
    "ort_npudet": "ONNX Runtime, fused npudet node graph (ort_library())",
    "aoti": "AOTInductor package (.pt2, fused cpu kernel), torch._inductor.aoti_load_package",
}
# Outputs are compared with this route's; speed-ups are taken against both.
REFERENCE = "eager_grid_sample"
BASELINE = "ort_gridsample"
FUSED = ("ort_npudet", "aoti")
# How each exported route is written: tools/export.py's --format and --msda-node.
EXPORTS = {
    "ort_gridsample": ("onnx", "gridsample"),
    "ort_npudet": ("onnx", "npudet"),
    "aoti": ("aoti", "gridsample"),
}
EAGER_IMPL = {"eager_grid_sample": "grid_sample", "eager_cpu": "cpu"}
# Scores (0..1) and boxes (normalised by the image size) agree within this; labels equal
# where the score is untied (detector.untied: tied places may swap).
TOLERANCE = 1e-4
TRACE_BATCH = 2  # torch.export specializes a size traced at 1


@dataclass(frozen=True)
class ModelSpec:
    """A model to time: its config (repository-relative or absolute) and the image size."""

    name: str
    config: str
    height: int
    width: int


MODELS: Dict[str, ModelSpec] = {
    # The shapes set's images are 256x256 (configs/_base_/datasets/shapes_detection.py).
    "small": ModelSpec(
        "small", "configs/small/deformable-detr-refine-twostage_r18-tiny_shapes.py", 256, 256
    ),
    "r50": ModelSpec(
        "r50",
        "configs/deformable_detr/deformable-detr-refine-twostage_r50_16xb2-50e_coco.py",
        800,
        1333,
    ),
}


def parse_routes(text: str) -> List[str]:
    """``'ort_npudet,aoti'`` -> the routes, in ``ROUTES``' order; ValueError naming --routes."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ROUTES]
    if unknown or not names:
        raise ValueError(f"--routes: expected some of {list(ROUTES)}, got {text!r}")
    return [r for r in ROUTES if r in names]


def parse_models(text: str) -> List[ModelSpec]:
    """``'small,r50'`` (names of ``MODELS``) or ``CONFIG@HxW`` items (a config file at an
    image size, named by its file) -> the specs; ValueError naming --models."""
    specs = []
    for item in (i.strip() for i in text.split(",")):
        if item in MODELS:
            specs.append(MODELS[item])
            continue
        config, _, size = item.rpartition("@")
        try:
            height, width = (int(v) for v in size.lower().split("x"))
        except ValueError:
            height = width = 0
        if not config or not Path(config).is_file() or min(height, width) < 65:
            raise ValueError(
                f"--models: expected {list(MODELS)} or CONFIG@HxW (an existing config, "
                f"H and W >= 65), got {item!r}"
            )
        specs.append(ModelSpec(Path(config).stem, config, height, width))
    return specs


def repo_path(path: str) -> Path:
    """``path`` as given if it exists, else relative to the checkout (npudet_dev is its dev/)."""
    given = Path(path)
    return given if given.exists() else Path(__file__).resolve().parents[3] / path


def build_random_model(config: str, seed: int, out_config: Path) -> torch.nn.Module:
    """``config``'s detector with random weights from ``seed`` (pretrained ``init_cfg``
    dropped: nothing is downloaded), in eval mode; the config it was built from, with the
    drop, is written to ``out_config`` for the exports."""
    from mmdet.registry import MODELS as REGISTRY
    from mmengine.registry import init_default_scope

    cfg = Config.fromfile(str(repo_path(config)))
    drop_pretrained(cfg)
    cfg.dump(str(out_config))
    init_default_scope(cfg.get("default_scope", "mmdet"))
    torch.manual_seed(seed)
    model = REGISTRY.build(cfg.model)
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)  # init_weights logs every parameter it leaves alone
    try:
        model.init_weights()
    finally:
        logger.setLevel(level)
    return model.eval()


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 over the state dict's names and values: which weights an export holds."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


def export_route(
    route: str, config: Path, checkpoint: Path, out: Path, spec: ModelSpec, key: str, timeout: float
) -> Dict[str, Any]:
    """Write ``route``'s file ``out`` with ``npudet.deploy.export`` in a child process (the
    ``tools/export.py`` command), unless ``out`` holds the export of ``key`` already.
    ``{"export_s": seconds, "reused": bool}`` (a reused file keeps the seconds its export
    took, None when not recorded), or ``{"error": ...}`` when the export failed or ran past
    ``timeout`` seconds (its process group is then killed). The stamp ``out.key`` holds the
    key on its first line and the export's seconds on the second."""
    stamp = out.with_name(out.name + ".key")
    fmt, node = EXPORTS[route]
    key = f"{key} {fmt} {node} {TRACE_BATCH}x{spec.height}x{spec.width}"
    if out.is_file() and stamp.is_file():
        lines = stamp.read_text().splitlines()
        if lines and lines[0] == key:
            return {"export_s": float(lines[1]) if len(lines) > 1 else None, "reused": True}
    out.unlink(missing_ok=True)
    argv = [str(config), str(checkpoint), "--format", fmt, "--out", str(out), "--msda-node", node,
            "--shape", str(spec.height), str(spec.width), "--batch", str(TRACE_BATCH)]  # fmt: skip
    code = "import sys, npudet.plugin; from npudet.deploy.export import main; main(sys.argv[1:])"
    start = time.perf_counter()
    # A session of its own: on the time limit, the export and the compile workers it started
    # are stopped together.
    child = subprocess.Popen(
        [sys.executable, "-c", code, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        return {"error": f"export stopped at the time limit of {timeout:.0f} s"}
    if child.returncode != 0:
        last = (stderr.strip().splitlines() or [f"exit {child.returncode}"])[-1]
        return {"error": f"export failed: {last[:300]}"}
    seconds = round(time.perf_counter() - start, 1)
    stamp.write_text(f"{key}\n{seconds}\n")
    return {"export_s": seconds, "reused": False}


Runner = Callable[[torch.Tensor], List[np.ndarray]]


@dataclass(frozen=True)
class TimedRoute:
    """A route to time: ``prepare()`` (untimed, before each call: the eager routes share one
    model and set its MSDA implementation) and ``run(images)`` (timed)."""

    prepare: Callable[[], None]
    run: Runner


def eager_route(graph: DetectorGraph, impl: str) -> TimedRoute:
    """``graph`` in PyTorch with every MSDA layer on ``impl`` (set by ``prepare``)."""

    def run(images: torch.Tensor) -> List[np.ndarray]:
        with torch.no_grad():
            return [t.numpy() for t in graph(images)]

    return TimedRoute(lambda: apply_msda_cfg(graph.detector, dict(impl=impl)), run)


def ort_runner(path: Path, threads: int, library: Optional[Path] = None) -> Runner:
    """``ort_session``'s session as a runner."""
    session = ort_session(path, threads, library)
    return lambda images: session.run(None, {"images": images.numpy()})


def ort_library_of(route: str) -> Optional[Path]:
    """The custom-op library an ORT route needs (the fused node's), or None."""
    return ort_library() if route == "ort_npudet" else None


def aoti_runner(path: Path) -> Runner:
    """The package ``path`` loaded in this process, the ``cpu`` kernel's library loaded
    first (it registers the op the package calls)."""
    from npudet.ops.msda.backends import cpu_library

    cpu_library.require()
    loaded = torch._inductor.aoti_load_package(str(path))

    def run(images: torch.Tensor) -> List[np.ndarray]:
        with torch.no_grad():
            return [t.numpy() for t in loaded(images)]

    return run


def make_route(route: str, graph: DetectorGraph, path: Optional[Path], threads: int) -> TimedRoute:
    """``route`` to time: ``graph`` eager, or the exported file ``path`` in its runtime."""
    if route in EAGER_IMPL:
        return eager_route(graph, EAGER_IMPL[route])
    run = aoti_runner(path) if route == "aoti" else ort_runner(path, threads, ort_library_of(route))
    return TimedRoute(lambda: None, run)


def time_routes(
    routes: Dict[str, TimedRoute], images: torch.Tensor, warmup: int, runs: int, threads: int
) -> Dict[str, Dict[str, Any]]:
    """``warmup`` untimed calls of each route, then ``runs`` rounds calling every route once,
    interleaved. Per route: its times (ms), their median, the median CPU ms per call (this
    process, all threads: ONNX Runtime's too), the rounds' ``conditions`` with ``loaded`` /
    ``loaded_why``, the last call's outputs; or ``{"error": ...}`` for a route whose runtime
    failed (the others go on)."""
    results: Dict[str, Dict[str, Any]] = {}
    live = dict(routes)

    def call(name: str) -> Optional[Any]:
        try:
            live[name].prepare()
            start, cpu = time.perf_counter(), time.process_time()
            outputs = live[name].run(images)
            wall_ms = (time.perf_counter() - start) * 1e3
            cpu_ms = (time.process_time() - cpu) * 1e3
        except Exception as err:  # a runtime that refuses the file: the other routes still run
            results[name] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
            del live[name]
            return None
        timed = results.setdefault(name, {"runs_ms": [], "cpu_ms": []})
        timed["runs_ms"].append(wall_ms)
        timed["cpu_ms"].append(cpu_ms)
        timed["outputs"] = outputs
        return outputs

    for name in list(live):
        for _ in range(warmup):
            if call(name) is None:
                break
    for name in live:  # the warm-up's times are not kept
        results[name] = {"runs_ms": [], "cpu_ms": []}
    with Recorder(threads) as recorder:
        for _ in range(runs):
            for name in list(live):
                call(name)
    marked = mark(record_reasons(recorder.record))
    for name in live:
        timed = results[name]
        timed.update(
            median_ms=statistics.median(timed["runs_ms"]),
            cpu_median_ms=statistics.median(timed.pop("cpu_ms")),
            # kept beside the conditions: the field results stored before them have
            load_avg_1m=recorder.record["load_1m"],
            conditions=recorder.record,
            **marked,
        )
    return results


def compare_outputs(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> Dict[str, Any]:
    """boxes (B, N, 4) xyxy in pixels, scores (B, N), labels (B, N) against the reference's:
    every score; boxes and labels where the reference's score is untied (tied places may
    hold either detection). The largest differences (boxes in pixels), whether the labels
    are equal, and the fraction of places compared."""
    boxes, scores, labels = (np.asarray(t) for t in got)
    w_boxes, w_scores, w_labels = (np.asarray(t) for t in want)
    if boxes.shape != w_boxes.shape or scores.shape != w_scores.shape:
        return {"agrees": False, "why": f"shapes {boxes.shape} vs {w_boxes.shape}"}
    box_diff = score_diff = 0.0
    labels_equal = True
    compared = 0
    for i in range(w_scores.shape[0]):
        keep = untied(w_scores[i])
        compared += int(keep.sum())
        score_diff = max(score_diff, float(np.abs(scores[i] - w_scores[i]).max()))
        if keep.any():
            box_diff = max(box_diff, float(np.abs(boxes[i] - w_boxes[i])[keep].max()))
            labels_equal &= bool(np.array_equal(labels[i][keep], w_labels[i][keep]))
    return {
        "max_score_diff": score_diff,
        "max_box_diff_px": box_diff,
        "labels_equal": labels_equal,
        "untied_fraction": compared / w_scores.size,
    }


def judge(diff: Dict[str, Any], height: int, width: int) -> Dict[str, Any]:
    """``diff`` with ``agrees``: scores and boxes (normalised by the image's larger side)
    within ``TOLERANCE``, labels equal, at least half the places untied."""
    if "why" in diff:
        return diff
    box = diff["max_box_diff_px"] / max(height, width)
    agrees = (
        diff["max_score_diff"] <= TOLERANCE
        and box <= TOLERANCE
        and diff["labels_equal"]
        and diff["untied_fraction"] >= 0.5
    )
    return {**diff, "max_box_diff_normalised": box, "agrees": agrees}


def speedups(times: Dict[str, float]) -> Dict[str, Dict[str, Optional[float]]]:
    """Per route: ``BASELINE``'s and ``REFERENCE``'s median over the route's (None when
    either was not timed)."""
    return {
        route: {
            f"vs_{base}": (times[base] / ms if base in times else None)
            for base in (BASELINE, REFERENCE)
        }
        for route, ms in times.items()
    }


def bench_model(
    spec: ModelSpec,
    routes: Sequence[str],
    work: Path,
    threads: int,
    warmup: int,
    runs: int,
    seed: int,
    export_timeout: float,
    log: Callable[[str], None] = print,
) -> Dict[str, Any]:
    """Export and time ``routes`` of one model (module docstring); the eager ``grid_sample``
    reference runs always (its outputs are what the others are compared with)."""
    work.mkdir(parents=True, exist_ok=True)
    config = work / f"{spec.name}.py"
    model = build_random_model(spec.config, seed, config)
    key = weights_digest(model)
    checkpoint = work / f"{spec.name}.pth"
    torch.save({"state_dict": model.state_dict(), "meta": {}}, checkpoint)
    graph = DetectorGraph(model).eval()
    images = example_images(1, spec.height, spec.width, seed=seed)
    results: Dict[str, Dict[str, Any]] = {}
    files: Dict[str, Path] = {}
    for route in (r for r in routes if r in EXPORTS):
        out = work / f"{spec.name}-{route}.{'pt2' if route == 'aoti' else 'onnx'}"
        log(f"[{spec.name}] exporting {route} -> {out.name}")
        results[route] = export_route(route, config, checkpoint, out, spec, key, export_timeout)
        files[route] = out
    timed_routes: Dict[str, TimedRoute] = {}
    for route in [REFERENCE, *(r for r in routes if r != REFERENCE)]:
        if "error" in results.get(route, {}):
            continue
        try:
            timed_routes[route] = make_route(route, graph, files.get(route), threads)
        except Exception as err:  # a runtime that refuses the file: the other routes still run
            results.setdefault(route, {})["error"] = f"{type(err).__name__}: {str(err)[:300]}"
    timed = time_routes(timed_routes, images, warmup, runs, threads)
    reference = timed[REFERENCE]["outputs"]
    for route in routes:
        if route not in timed:
            continue
        if "error" in timed[route]:
            results.setdefault(route, {})["error"] = timed[route]["error"]
            continue
        got = {k: v for k, v in timed[route].items() if k != "outputs"}
        diff = compare_outputs(timed[route]["outputs"], reference)
        results.setdefault(route, {}).update(got, agreement=judge(diff, spec.height, spec.width))
        log(f"[{spec.name}] {route}: {got['median_ms']:.1f} ms")
        if route in EXPORTS and route != "aoti":
            # A separate profiled session: the profiler's cost stays out of the times above.
            session = partial(ort_session, files[route], threads, ort_library_of(route))
            results[route]["ort_op_ms"] = profile_session(session, {"images": images.numpy()})
    times = {r: v["median_ms"] for r, v in results.items() if "median_ms" in v}
    ratios = speedups(times)
    cpu_ratios = speedups({r: v["cpu_median_ms"] for r, v in results.items() if r in times})
    for route in times:
        results[route]["speedup"] = ratios[route]
        results[route]["cpu_time_speedup"] = cpu_ratios[route]
    return {
        "config": spec.config,
        "input": [1, 3, spec.height, spec.width],
        "weights": f"random (seed {seed}; pretrained init_cfg dropped), the same in every route",
        "routes": {r: results[r] for r in routes if r in results},
    }


def bench_deploy(
    specs: Sequence[ModelSpec],
    routes: Sequence[str],
    work: Path,
    threads: int = 1,
    warmup: int = 1,
    runs: int = 5,
    seed: int = 0,
    export_timeout: float = 3600.0,
    on_model: Optional[Callable[[Dict[str, Any]], None]] = None,
    log: Callable[[str], None] = print,
) -> Dict[str, Any]:
    """Every model of ``specs`` on every route of ``routes``: the result JSON's content.
    ``on_model(result)`` is called after each model (to write what is done so far)."""
    import onnxruntime

    torch.set_num_threads(threads)
    result: Dict[str, Any] = {
        "commit": git_commit(),
        "machine": machine_info(),
        "cpu_count": os.cpu_count(),
        "versions": {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__},
        "threads": {"torch": torch.get_num_threads(), "ort_intra_op": threads, "ort_inter_op": 1},
        "batch": 1,
        "warmup": warmup,
        "runs": runs,
        "seed": seed,
        "export_timeout_s": export_timeout,
        "routes": {r: ROUTES[r] for r in routes},
        "reference": REFERENCE,
        "baseline": BASELINE,
        "tolerance": TOLERANCE,
        "loaded_rule": RULE,
        "models": {},
    }
    for spec in specs:
        result["models"][spec.name] = bench_model(
            spec, routes, work, threads, warmup, runs, seed, export_timeout, log
        )
        if on_model is not None:
            on_model(result)
    return result
