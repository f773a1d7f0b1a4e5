"""``dev/tools/bench_deploy.py``: the routes' latency side by side, and each route's outputs
checked against eager ``grid_sample``'s.

The tool runs on a Deformable DETR of the small config with 1 encoder and 2 decoder layers
at 96x128 (random weights), on eager ``grid_sample`` and ``cpu`` and ONNX Runtime's fused
``npudet`` node graph (exported by the tool through ``npudet.deploy.export``): the JSON and
markdown hold every route's times, speed-ups and agreement, and every route agrees. That run
is slow (an export and three routes); the default run times stand-in routes: interleaved round
by round, conditions recorded, a loaded speed-up marked with its CPU-time one.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from plugin_util import SMALL_DETR, run_tool, tiny_config

from npudet.benchmark import conditions
from npudet_dev.deploy.bench import (
    REFERENCE,
    TimedRoute,
    bench_model,
    compare_outputs,
    judge,
    parse_models,
    parse_routes,
    speedups,
    time_routes,
)
from npudet_dev.deploy.bench_report import goal_line, markdown, model_table, read_result

# Tests of the project's own machinery (dev/).
pytestmark = pytest.mark.dev

ROUTES = ["eager_grid_sample", "eager_cpu", "ort_npudet"]
RUNS = 2
HEIGHT, WIDTH = 96, 128


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """The tool's JSON and markdown for the tiny model on ``ROUTES``."""
    tmp = tmp_path_factory.mktemp("bench_deploy")
    config = tiny_config(tmp, SMALL_DETR)
    out = tmp / "speed.json"
    done = run_tool(
        ["dev/tools/bench_deploy.py", "--models", f"{config}@{HEIGHT}x{WIDTH}",
         "--routes", ",".join(ROUTES), "--runs", str(RUNS), "--warmup", "1", "--threads", "1",
         "--json", str(out), "--work-dir", str(tmp / "work")]
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(out.read_text()), (tmp / "speed.md").read_text(), done.stdout, out


@pytest.mark.slow
def test_every_route_is_timed_and_agrees_with_eager(bench):
    result, _, _, _ = bench
    assert result["threads"] == {"torch": 1, "ort_intra_op": 1, "ort_inter_op": 1}
    assert result["machine"]["cpu_model"] and result["commit"]
    (model,) = result["models"].values()
    assert model["input"] == [1, 3, HEIGHT, WIDTH]
    assert list(model["routes"]) == ROUTES
    for route, r in model["routes"].items():
        assert "error" not in r, (route, r)
        assert len(r["runs_ms"]) == RUNS and min(r["runs_ms"]) <= r["median_ms"]
        assert r["agreement"]["agrees"], (route, r["agreement"])
        reference = model["routes"][REFERENCE]["median_ms"]
        assert r["speedup"]["vs_eager_grid_sample"] == pytest.approx(reference / r["median_ms"])
        assert r["speedup"]["vs_ort_gridsample"] is None  # not among the routes run
    fused = model["routes"]["ort_npudet"]
    assert fused["export_s"] > 0 and not fused["reused"]  # exported in this run
    assert fused["ort_op_ms"]["MultiScaleDeformableAttn"] > 0  # the profile sees the node
    assert fused["conditions"]["threads"] == 1 and fused["cpu_median_ms"] > 0
    assert fused["cpu_time_speedup"]["vs_eager_grid_sample"] > 0
    assert isinstance(fused["loaded"], bool) and "loaded" in result["loaded_rule"]


@pytest.mark.slow
def test_markdown_names_the_cpu_and_every_route(bench):
    result, md, stdout, path = bench
    assert markdown(read_result(str(path))) == md  # what --report-only rewrites
    assert result["machine"]["cpu_model"] in md and stdout.endswith(md)
    rows = [line for line in md.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == ROUTES
    assert all("| yes (" in row for row in rows)


def test_routes_are_interleaved_and_a_loaded_round_is_marked(monkeypatch):
    """Three rounds call a, b, a, b, a, b (each prepared before its call); a route whose runtime
    fails is dropped with its error, the others go on; a load of 2.0 on 1 thread marks them."""
    calls = []

    def route(name, fail=False):
        def run(images):
            if fail and name in calls:  # its warm-up call passes, its first timed one fails
                raise RuntimeError("refused")
            calls.append(name)
            return [images]

        return TimedRoute(lambda: calls.append(f"prepare {name}"), run)

    monkeypatch.setattr(conditions, "load_1m", lambda: 2.0)
    timed = time_routes(
        {"a": route("a"), "b": route("b"), "c": route("c", fail=True)}, np.zeros(1), 1, 3, 1
    )
    assert calls[:6] == ["prepare a", "a", "prepare b", "b", "prepare c", "c"]  # warm-up
    assert calls[6:12] == ["prepare a", "a", "prepare b", "b", "prepare c", "prepare a"]
    assert [c for c in calls[6:] if not c.startswith("prepare")] == ["a", "b"] * 3
    assert timed["c"] == {"error": "RuntimeError: refused"}
    for name in ("a", "b"):
        assert len(timed[name]["runs_ms"]) == 3 and timed[name]["cpu_median_ms"] >= 0
        assert timed[name]["loaded"] and timed[name]["conditions"]["load_1m"] == [2.0, 2.0]
        assert timed[name]["loaded_why"] == "load 2.0 > 1 threads + 0.5"


def test_eager_routes_of_a_tiny_model_interleave_and_agree(tmp_path):
    """bench_model without exports: both eager routes timed in the same rounds, their
    conditions shared, each agreeing with the reference's outputs."""
    config = tiny_config(tmp_path, SMALL_DETR)
    (spec,) = parse_models(f"{config}@{HEIGHT}x{WIDTH}")
    routes = ["eager_grid_sample", "eager_cpu"]
    model = bench_model(spec, routes, tmp_path / "work", 1, 0, 2, 0, 60.0, log=lambda _: None)
    assert list(model["routes"]) == routes
    first, second = (model["routes"][r] for r in routes)
    assert first["conditions"] == second["conditions"] and len(second["runs_ms"]) == 2
    assert all(r["agreement"]["agrees"] and "outputs" not in r for r in (first, second))
    assert second["cpu_time_speedup"]["vs_eager_grid_sample"] > 0


def _route(ms, loaded, cpu_ms=None):
    route = {"median_ms": ms, "runs_ms": [ms], "load_avg_1m": [0.2, 0.3], "agreement": {
        "agrees": True, "max_score_diff": 0.0, "max_box_diff_normalised": 0.0,
        "labels_equal": True}}  # fmt: skip
    if loaded is not None:
        route.update(loaded=loaded, loaded_why="load 2.0 > 1 threads + 0.5" if loaded else "")
    return route


@pytest.mark.parametrize("loaded", [True, False, None])
def test_a_loaded_speedup_is_marked_in_the_table_and_not_judged(loaded):
    """Interleaved routes share their conditions; a result stored before them is judged by
    each route's own load (None: 0.2-0.3 here, quiet)."""
    routes = {"ort_gridsample": _route(300.0, loaded), "ort_npudet": _route(100.0, loaded)}
    times = {r: v["median_ms"] for r, v in routes.items()}
    for name, r in routes.items():
        r["speedup"] = speedups(times)[name]
        r["cpu_time_speedup"] = speedups({"ort_gridsample": 150.0, "ort_npudet": 100.0})[name]
    model = {"input": [1, 3, 96, 128], "config": "c.py", "weights": "random", "routes": routes}
    table = model_table("m", model, {r: r for r in routes})
    goal = goal_line("m", model)
    if loaded:
        assert "| (3.00x) loaded, CPU-time 1.50x |" in table
        assert "`ort_npudet` (3.00x) not judged: loaded" in goal
    else:
        assert "| 3.00x |" in table and "loaded" not in table
        assert "`ort_npudet` 3.00x (met)" in goal


def test_a_wrong_route_output_disagrees():
    gen = np.random.default_rng(0)
    scores = np.sort(gen.random((1, 20)), axis=1)[:, ::-1].astype(np.float32)
    boxes = gen.random((1, 20, 4)).astype(np.float32) * 100
    labels = gen.integers(0, 3, (1, 20))
    want = [boxes, scores, labels]
    assert judge(compare_outputs(want, want), 100, 100)["agrees"]
    for i, wrong in [(0, boxes + 0.1), (1, scores + 1e-3), (2, labels + 1)]:
        got = list(want)
        got[i] = wrong
        assert not judge(compare_outputs(got, want), 100, 100)["agrees"], i


def test_speedups_against_both_baselines():
    ratios = speedups({"ort_gridsample": 300.0, "eager_grid_sample": 200.0, "aoti": 100.0})
    assert ratios["aoti"] == {"vs_ort_gridsample": 3.0, "vs_eager_grid_sample": 2.0}


@pytest.mark.parametrize(
    "parse,text,message",
    [
        (parse_routes, "ort_trt", "--routes: expected some of"),
        (parse_models, "r101", "--models: expected ['small', 'r50'] or CONFIG@HxW"),
        (parse_models, f"{SMALL_DETR}@32x32", "H and W >= 65"),
    ],
)
def test_bad_routes_and_models_are_named(parse, text, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse(text)


def test_report_only_names_a_missing_result(tmp_path):
    with pytest.raises(ValueError, match="--json: cannot read a result from"):
        read_result(str(tmp_path / "none.json"))
