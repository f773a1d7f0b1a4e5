"""dev/tools/bench_iteration.py on the small DINO at 160x160: stock mmdet + mmcv against npudet.

Three runs (``stock``, ``grid_sample``, ``cpu``), 2 iterations each, every one in its own
process. The JSON must hold every run's per-iteration losses, times and time split, its
peak memory and the machine; ``stock`` must really be mmdet's detector on mmcv's MSDA layer
with no npudet model code loaded, the others npudet's; and the losses of every npudet run
must equal stock's within the stated float32 tolerance at every iteration (same weights,
same batch, same random state). The op was timed in every run (stock's through mmcv's
sampling function), and the phases add up to the iteration. That run is slow; the default
run checks, on stand-in runs, the interleaved order of the rounds, the conditions recorded
and the ``loaded`` marking (JSON, table, plot) on an injected load.
"""

from __future__ import annotations

import json
import math
import os
import re

import pytest
from iteration_tool_util import run_iteration_tool
from matplotlib.colors import to_hex
from plugin_util import ROOT

from npudet.benchmark import conditions
from npudet_dev.ablation.iteration_bench import (
    LOSS_RTOLS,
    bench_iteration,
    goals,
    loss_bounds,
    run_order,
    summarise,
)
from npudet_dev.ablation.iteration_report import (
    matching_lines,
    term_deviations,
    term_lines,
    time_split_figure,
)
from npudet_dev.ablation.roundoff_control import parse_run_name
from npudet_dev.ablation.time_split import PHASES

# Tests of the project's own machinery (dev/).
pytestmark = pytest.mark.dev

CONFIG = os.path.join(ROOT, "configs", "small", "dino-4scale_r18-tiny_shapes.py")
IMPLS = ("stock", "grid_sample", "cpu")
ITERS = 2


# 58 s on 2 cores: three real trainings (test_bench_iteration_rounds_interleave_and_mark_loaded
# keeps the order and the marking in the default run).
@pytest.mark.slow
def test_bench_iteration_small_dino(tmp_path) -> None:
    out = tmp_path / "bench.json"
    args = ["--impls", ",".join(IMPLS), "--size", "160x160", "--iters", str(ITERS)]
    args += ["--warmup", "1", "--rounds", "1"]
    result, _ = run_iteration_tool("dev/tools/bench_iteration.py", CONFIG, out, *args)
    assert result["reference"] == "stock" and result["input"] == "160x160"
    assert result["machine"]["cpu_model"] and result["machine"]["aten_capability"]
    assert list(result["runs"]) == list(IMPLS) == list(result["summary"])
    assert {run["commit"] for run in result["runs"].values()} == {result["commit"]}
    assert os.path.isfile(str(out).replace(".json", ".md"))
    assert os.path.isfile(str(out).replace(".json", "_split.png"))
    assert result["rounds"] == 1 and "loaded" in result["loaded_rule"]
    for name, run in result["runs"].items():
        cond = run["conditions"]
        assert len(cond["load_1m"]) == 2 and cond["cpu_s"] > 0 and cond["wall_s"] > 0
        assert cond["threads"] == 2
        assert isinstance(result["summary"][name]["loaded"], bool)

    stock = result["runs"]["stock"]
    assert stock["detector"] == "mmdet.models.detectors.dino.DINO"
    assert stock["msda_layer_classes"] == [
        "mmcv.ops.multi_scale_deform_attn.MultiScaleDeformableAttention"
    ]
    assert not [
        m for m in stock["npudet_modules"] if m.startswith(("npudet.models", "npudet.plugin"))
    ]
    for impl in IMPLS:
        run = result["runs"][impl]
        assert len(run["loss"]) == len(run["iter_ms"]) == len(run["loss_terms"]) == ITERS
        assert all(math.isfinite(x) for x in run["loss"])
        # mmdet's total is the sum of the logged terms (encoder, decoder layers, denoising)
        for total, terms in zip(run["loss"], run["loss_terms"]):
            assert len(terms) > 10 and math.isclose(sum(terms.values()), total, rel_tol=1e-5)
        assert run["peak_rss_mb"] > 100
        # every Hungarian matching recorded (decoder layers and the encoder's proposals), the
        # same calls in every run; a differing one must be a near tie broken stock's way
        assert len(run["matching"]) == ITERS and all(run["matching"])
        assert len(run["matching"][0]) == len(stock["matching"][0]) >= 4
        assert all(t["adopted"] for t in run["matching_ties"]), run["matching_ties"]
        # 3 encoder + 3 decoder layers, each iteration
        assert run["msda_calls"] == 6
        for i in range(ITERS):
            phases = [run["phases"][p][i] for p in PHASES]
            assert math.isclose(sum(phases), run["iter_ms"][i], rel_tol=1e-6)
            assert run["phases"]["msda_fwd"][i] > 0 and run["phases"]["msda_bwd"][i] > 0
            assert run["phases"]["backbone"][i] > 0 and run["phases"]["loss_assigner"][i] > 0
        if impl != "stock":
            assert run["detector"] == "npudet.models.detectors.dino.DINO"
            assert run["msda_impls"] == {"encoder": impl, "decoder": impl}
            # both iterations are judged: the first on the same weights, the second one
            # AdamW step later (LOSS_RTOLS says why each bound is what it is)
            for got, ref, rtol in zip(run["loss"], stock["loss"], LOSS_RTOLS):
                assert abs(got - ref) <= rtol * abs(ref), (impl, run["loss"], stock["loss"])
        assert result["summary"][impl]["losses_agree"]


def test_run_order_interleaves_rounds_reference_first() -> None:
    assert run_order(["cpu", "stock", "gather"], "stock", 2) == [
        (0, "stock"), (0, "cpu"), (0, "gather"), (1, "stock"), (1, "cpu"), (1, "gather")
    ]  # fmt: skip


def test_bench_iteration_rounds_interleave_and_mark_loaded(tmp_path, monkeypatch) -> None:
    """Two rounds of stock and cpu on stand-in runs: they run stock, cpu, stock, cpu; every
    round records its conditions; cpu's second round meets a load of 4.2 on 2 threads, so
    its speed-up is marked loaded in the JSON, the table (with the CPU-time speed-up) and the
    plot (greyed); the timings pool both rounds."""
    calls = []
    loads = iter([0.5, 0.6, 0.5, 0.6, 0.5, 0.6, 4.0, 4.2])
    monkeypatch.setattr(conditions, "load_1m", lambda: next(loads))

    def fake_run(spec, threads, module):
        calls.append((spec["impl"], os.path.basename(spec["work_dir"])))
        wall = 100.0 if spec["impl"] == "stock" else 50.0
        record = _run([3.0, 2.0])
        record.update(iter_ms=[999.0, wall], iter_cpu_ms=[999.0, 1.5 * wall])
        return record

    out = tmp_path / "bench.json"
    result = bench_iteration(
        os.path.join(ROOT, "configs", "small", "dino-4scale_r18-tiny_shapes.py"),
        ["stock", "cpu"], 2, 1, str(tmp_path / "work"), size=(64, 64), json_out=str(out),
        rounds=2, run_variant_fn=fake_run,
    )  # fmt: skip
    assert calls == [("stock", "round0"), ("cpu", "round0"), ("stock", "round1"), ("cpu", "round1")]
    stored = json.loads(out.read_text())
    assert stored == json.loads(json.dumps(result)) and stored["rounds"] == 2
    cpu = stored["summary"]["cpu"]
    assert cpu["rounds"] == 2 and cpu["speedup"] == pytest.approx(2.0)
    assert cpu["loaded"] and not stored["summary"]["stock"]["loaded"] and cpu["run_loaded"]
    assert cpu["loaded_why"] == "cpu: load 4.2 > 2 threads + 0.5"
    assert stored["runs"]["cpu"]["rounds"][0]["conditions"]["load_1m"] == [4.0, 4.2]
    assert stored["runs"]["stock"]["conditions"]["threads"] == 2
    table = (tmp_path / "bench.md").read_text()
    assert "| (2.00x) loaded, CPU-time 2.00x |" in table
    assert "load 0.5-0.6, load 4.0-4.2; loaded (cpu: load 4.2 > 2 threads + 0.5) |" in table
    assert (tmp_path / "bench_split.png").read_bytes()[:4] == b"\x89PNG"
    (ax,) = [a for a in time_split_figure(stored, "t").axes]
    texts = {t.get_text(): to_hex(t.get_color()) for t in ax.texts}
    assert texts["0.1 s\n1.00x"] == "#000000"
    assert texts["0.1 s\n(wall 2.00x: loaded)\nCPU-time 2.00x"] == conditions.LOADED_TEXT
    colours = [to_hex(bar.get_facecolor()) for bar in ax.patches]
    assert colours[1::2] == [conditions.LOADED_STYLE["facecolor"]] * len(PHASES)
    assert conditions.LOADED_STYLE["facecolor"] not in colours[0::2]


def test_stored_runs_without_load_are_judged_by_wall_over_cpu_time() -> None:
    """A stored run whose wall time is 2.9x its CPU time (stock's in the stored real-size
    Deformable DETR table) makes every ratio against it loaded; a run at 1.05x is quiet."""
    runs = {"stock": _run([3.0, 2.0]), "cpu": _run([3.0, 2.0])}
    runs["stock"].update(iter_ms=[1.0, 205.2], iter_cpu_ms=[1.0, 71.1])
    runs["cpu"].update(iter_ms=[1.0, 38.0], iter_cpu_ms=[1.0, 36.3])
    summary = summarise(runs, "stock", warmup=1)
    assert summary["stock"]["run_loaded"] and not summary["cpu"]["run_loaded"]
    assert summary["cpu"]["loaded"] and summary["cpu"]["loaded_why"] == (
        "stock: wall 2.9x CPU time"
    )
    assert summary["cpu"]["cpu_time_speedup"] == pytest.approx(71.1 / 36.3)


def _run(losses):
    return {"loss": losses, "iter_ms": [1.0] * len(losses), "iter_cpu_ms": [1.0] * len(losses),
            "phases": {p: [0.0] * len(losses) for p in PHASES}, "peak_rss_mb": 100.0}  # fmt: skip


def test_round_off_control_widens_only_its_iterations_bounds() -> None:
    """``stock@1`` (stock on one thread) deviates 2e-3 at iteration 1: a run within 3x that
    agrees, one beyond it does not, iteration 0 keeps 1e-5; the control is not judged."""
    runs = {
        "stock": _run([10.0, 5.0, 4.0]),
        "stock@1": _run([10.0, 5.01, 4.2]),
        "cpu": _run([10.0, 4.98, 4.5]),  # 4e-3 at iteration 1: within 3 x 2e-3
        "gather": _run([10.0, 5.04, 4.0]),  # 8e-3: beyond it
        "grid_sample": _run([10.001, 5.0, 4.0]),  # 1e-4 at iteration 0: beyond 1e-5
    }
    assert loss_bounds(runs, "stock") == pytest.approx([LOSS_RTOLS[0], 6e-3])
    summary = summarise(runs, "stock", warmup=0)
    agree = {impl: s["losses_agree"] for impl, s in summary.items() if not s["control"]}
    assert agree == {"stock": True, "cpu": True, "gather": False, "grid_sample": False}
    assert summary["stock@1"]["control"] and not goals(summary, "stock")["losses_agree"]
    assert loss_bounds({k: runs[k] for k in ("stock", "cpu")}, "stock") == list(LOSS_RTOLS)


def test_term_deviations_name_the_terms_that_part_first() -> None:
    """The report names, per run, the loss terms furthest from the reference's at an
    iteration; runs stored without per-term losses are left out."""
    ref = _run([3.0, 2.0])
    ref["loss_terms"] = [{"loss_cls": 1.0, "loss_bbox": 2.0}, {"loss_cls": 0.5, "loss_bbox": 1.5}]
    other = _run([3.001, 2.0])
    other["loss_terms"] = [{"loss_cls": 1.0, "loss_bbox": 2.001}, dict(ref["loss_terms"][1])]
    result = {"reference": "cpu", "runs": {"cpu": ref, "gather": other, "old": _run([3.0, 2.0])}}
    devs = term_deviations(result, 0)
    assert list(devs) == ["gather"]
    assert devs["gather"][0][0] == "loss_bbox"
    assert devs["gather"][0][1] == pytest.approx(1e-3)
    assert devs["gather"][1] == ("loss_cls", 0.0, 1.0)
    assert "`gather`: loss_bbox 1.0e-03 (of 2.0000)" in term_lines(result)
    assert term_deviations(result, 2) == {}


def test_matching_lines_say_where_a_run_matched_otherwise() -> None:
    ref, tied, same = _run([3.0]), _run([3.0]), _run([3.0])
    for run in (ref, tied, same):
        run["matching"] = [[[[0, 0]], [[1, 0]]]]
    ref["matching_ties"], same["matching_ties"] = [], []
    tied["matching_ties"] = [
        {"iteration": 0, "call": 1, "queries": 2, "gap": 1e-7, "rel_gap": 2e-7, "adopted": True}
    ]
    runs = {"cpu": ref, "grid_sample": tied, "gather": same, "old": _run([3.0])}
    text = matching_lines({"reference": "cpu", "runs": runs})
    assert "`grid_sample`: iteration 0, assigner call 2 of 2: 2 queries" in text
    assert "2e-07 of the total more (a tie, the reference's taken)" in text
    assert "`gather`: every matching the reference's" in text
    assert "`old`" not in text and "- `cpu`" not in text
    tied["matching_ties"][0].update(adopted=False, rel_gap=0.3)
    assert "**not a tie, kept**" in matching_lines({"reference": "cpu", "runs": runs})


def test_control_names() -> None:
    assert parse_run_name("cpu") == ("cpu", None, False) and not parse_run_name("cpu").control
    assert parse_run_name("stock+ulp@1") == ("stock", 1, True)
    assert parse_run_name("stock@2").control and parse_run_name("stock+ulp").control
    assert parse_run_name("cpu:stock") == ("cpu:stock", None, False)


@pytest.mark.parametrize(
    "name,why",
    [("stock@0", "IMPL@THREADS"), ("cpu@x", "IMPL@THREADS"), ("cpu@", "IMPL@THREADS"),
     ("cpu+ulp", "stock[+]ulp"), ("stock+half", "stock[+]ulp"), ("stock:fast", "IMPL:LAYERS"),
     ("cpu:gelu", "expected 'fast', 'stock' or pieces")],
)  # fmt: skip
def test_bad_control_name_names_the_run(name, why) -> None:
    with pytest.raises(ValueError, match=f"'{re.escape(name)}'.*{why}"):
        parse_run_name(name)


def test_ulp_control_moves_mmcv_locations_and_output_by_one_ulp_and_undoes(monkeypatch) -> None:
    import torch
    from mmcv.ops import multi_scale_deform_attn as mmcv_msda

    from npudet_dev.ablation.roundoff_control import perturb_mmcv_output

    seen = {}
    fixed = torch.rand(1, 7, 16) + 0.5

    def recorder(value, shapes, locations, weights):  # what the perturbation wraps
        seen["locations"] = locations
        return fixed

    monkeypatch.setattr(mmcv_msda, "multi_scale_deformable_attn_pytorch", recorder)
    locations = torch.rand(1, 7, 2, 2, 3, 2) + 0.5
    state = torch.get_rng_state()
    undo = perturb_mmcv_output(seed=0)
    out = mmcv_msda.multi_scale_deformable_attn_pytorch(None, None, locations, None)
    undo()
    assert torch.equal(torch.get_rng_state(), state)  # the run's random state is untouched
    assert mmcv_msda.multi_scale_deformable_attn_pytorch is recorder
    for got, want in ((seen["locations"], locations), (out, fixed)):
        rel = ((got - want) / want).abs()
        # one ulp of 1 times the value, rounded to the value's own ulp: at most 2 ulps relative
        assert rel.max() <= 2.0**-22 and (rel > 0).float().mean() > 0.9
