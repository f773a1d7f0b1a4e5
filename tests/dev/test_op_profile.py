"""The op-level profile of a training iteration (npudet_dev.ablation.op_profile,
dev/tools/profile_iteration.py).

By default: the attribution rules on a hand-built event tree whose split is known (innermost
scope, the MSDA layer's mixed scopes by op name, backward nodes linked by sequence number, a
node no forward op recorded, AccumulateGrad, other threads, the sum against the total); and
one profiled training step of the small Deformable DETR (one encoder and one decoder layer,
64x48) with the scopes marked: every part present, the MSDA op forward and backward, each MSDA
projection one ``aten::linear`` per layer call, the categories summing to the iteration, the
backward linked, the scopes removed afterwards. Slow: the same step on the small DINO, and the
tool end to end (its own process, a generated batch, JSON and table).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

import pytest
import torch
from iteration_tool_util import run_iteration_tool
from plugin_util import SMALL_DETR, SMALL_DINO, build_model, small_cfg

from npudet.ops.msda.observe import active_observers
from npudet_dev.ablation.op_profile.report import markdown
from npudet_dev.ablation.op_profile.run import profile_iteration
from npudet_dev.ablation.op_profile.split import (
    CATEGORIES,
    NODE,
    SCOPE,
    attribute,
    attribute_iteration,
    mean_split,
    totals,
    transformer_rest,
)

# Tests of the project's own machinery (dev/).
pytestmark = pytest.mark.dev

MSDA_PROJECTIONS = ("msda.value_proj", "msda.offsets_proj", "msda.weights_softmax")


@dataclass
class _Range:
    start: float
    end: float


@dataclass
class Ev:
    """What the analysis reads of a torch.profiler FunctionEvent; times given in ms."""

    name: str
    start: float
    end: float
    children: List[Ev] = field(default_factory=list)
    sequence_nr: int = -1
    thread: int = 1
    fwd_thread: int = 1

    def __post_init__(self) -> None:
        self.time_range = _Range(1e3 * self.start, 1e3 * self.end)
        self.cpu_children = self.children
        busy = sum(c.end - c.start for c in self.children)
        self.self_cpu_time_total = 1e3 * (self.end - self.start - busy)


def scope(kind: str, start: float, end: float, *children: Ev) -> Ev:
    return Ev(SCOPE + kind, start, end, list(children))


def node(name: str, start: float, end: float, seq: int, *children: Ev) -> Ev:
    return Ev(NODE + name, start, end, list(children), sequence_nr=seq)


def known_iteration() -> Ev:
    """An iteration whose split is worked out in test_attribution_rules."""
    attend = scope(
        "msda.attend",
        0,
        20,
        scope("msda.offsets_proj", 0, 5, Ev("aten::linear", 1, 5, sequence_nr=10)),
        Ev("aten::softmax", 5, 7, [Ev("aten::_softmax", 5.5, 7)], sequence_nr=11),
        Ev("aten::view", 7, 8, sequence_nr=13),  # peeks 13 too, but starts first
        Ev("aten::add", 8, 10, sequence_nr=13),
        scope("msda.op", 10, 18, Ev("npudet::msda_cpu_forward", 11, 18, sequence_nr=14)),
    )
    layer = scope(
        "msda.layer",
        0,
        30,
        attend,
        Ev("aten::add", 20, 22, sequence_nr=15),
        Ev("aten::mul", 22, 23, sequence_nr=16),
    )
    # relu_ on a view makes its node (17), then CopySlices (18): no op records 18
    forward = scope(
        "detector", 0, 40, layer, scope("ffn", 30, 40, Ev("aten::relu_", 30, 35, sequence_nr=17))
    )
    backward = scope(
        "backward",
        40,
        90,
        node("torch::autograd::CopySlices", 40, 45, 18),
        node("MSDACpuBackward", 45, 60, 14, Ev("npudet::msda_cpu_backward", 46, 59)),
        node("SoftmaxBackward0", 60, 65, 11),
        node("AddBackward0", 65, 67, 15),
        node("torch::autograd::AccumulateGrad", 67, 70, -1),
        node("MulBackward0", 70, 72, 5),  # below every recorded number: not linked
        node("AddBackward0", 72, 74, 13),
    )
    optimizer = scope("optimizer", 90, 98, Ev("aten::add_", 91, 97))
    return scope("iteration", 0, 100, forward, backward, optimizer)


def test_attribution_rules() -> None:
    root = known_iteration()
    elsewhere = Ev("aten::mm", 50, 60, thread=2)
    split = attribute_iteration(root, [root, elsewhere])
    cat = split["categories"]
    expected = {
        ("msda.host", "forward"): 7 + 2,  # the layer's and deformable_attend's own time
        ("msda.offsets_proj", "forward"): 5,
        ("msda.weights_softmax", "forward"): 2,
        ("msda.weights_softmax", "backward"): 5,
        ("msda.reshapes", "forward"): 1,
        ("msda.locations", "forward"): 2,
        ("msda.locations", "backward"): 2,  # node 13: the add, the later of its two ops
        ("msda.op", "forward"): 8,
        ("msda.op", "backward"): 15,
        ("msda.residual", "forward"): 3,
        ("msda.residual", "backward"): 2,
        ("ffn", "forward"): 10,
        ("ffn", "backward"): 5,  # CopySlices: within relu_
        ("grad_accumulation", "backward"): 3,
        ("autograd_engine", "backward"): 50 - 34,
        ("unlinked", "backward"): 2,
        ("optimizer", "other"): 8,
        ("other", "other"): 2,
    }
    found = {(k, p): v for k, phases in cat.items() for p, v in phases.items() if v}
    assert found == pytest.approx(expected)
    assert split["total_ms"] == split["sum_ms"] == pytest.approx(100)
    assert split["unattributed_ms"] == pytest.approx(4)
    assert split["other_threads_ms"] == pytest.approx(10)
    assert split["unlinked_nodes"] == {"MulBackward0": pytest.approx(2)}
    assert split["calls"]["msda.offsets_proj"] == {"aten::linear": 1}
    assert split["calls"]["msda.weights_softmax"] == {"aten::softmax": 1}
    assert split["scopes"]["msda.op"] == split["scopes"]["msda.layer"] == 1
    ops = split["top_ops"]["msda.op"]
    assert ops["backward"]["MSDACpuBackward > npudet::msda_cpu_backward"] == pytest.approx(13)
    # two iterations: the mean, a category missing from one counting as zero
    twice = mean_split([split, attribute(list(_flatten(known_iteration())))[0]])
    assert twice["iterations"] == 2 and twice["total_ms"] == pytest.approx(100)
    rows = totals(twice)
    assert rows["group:msda"]["total"] + rows["group:rest"]["total"] == pytest.approx(100)
    assert rows["msda.op"]["share"] == pytest.approx(0.23)
    # the benchmark's "transformer rest": all but the op (23), optimizer (8) and outside (2)
    rest = transformer_rest(split)
    assert rest == pytest.approx({"total": 67, "msda_layers": 9 + 5 + 7 + 1 + 4 + 5, "others": 36})


def _flatten(event: Ev):
    yield event
    for child in event.children:
        yield from _flatten(child)


def profiled_step(path: str, layers: str = "stock"):
    """One training step of the small config at ``path`` (1 + 1 layers, 64x48, ``layers``:
    ``model.msda.layers``) profiled inside the scopes; returns (split, model, optim wrapper,
    hook counts before marking)."""
    from mmdet.testing import demo_mm_inputs
    from mmengine.optim import OptimWrapper
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    from npudet_dev.ablation.op_profile.scopes import mark_scopes

    cfg = small_cfg(path, impl="cpu", layers=layers)
    cfg.model.encoder.num_layers = cfg.model.decoder.num_layers = 1
    model = build_model(cfg)
    model.train()
    wrapper = OptimWrapper(torch.optim.AdamW(model.parameters(), lr=1e-4))
    torch.manual_seed(0)
    batch = demo_mm_inputs(batch_size=1, image_shapes=(3, 48, 64), num_items=[2], num_classes=3)
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    undo = mark_scopes(model, wrapper)
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            with record_function(SCOPE + "iteration"):
                model.train_step(batch, wrapper)
    finally:
        undo()
    (split,) = attribute(list(prof.events()))
    return split, model, wrapper, hooks


def check_split(split) -> None:
    cat = split["categories"]
    calls = split["scopes"]["msda.layer"]
    assert calls == split["scopes"]["msda.op"] > 0
    # the op, forward and backward (its node linked to the forward op)
    assert cat["msda.op"]["forward"] > 0 and cat["msda.op"]["backward"] > 0
    # each projection is one linear per layer call, in its own category, and its backward
    # (the matmul nodes) is linked back to it
    for key in (*MSDA_PROJECTIONS, "msda.output_proj"):
        assert split["calls"][key]["aten::linear"] == calls, key
        assert cat[key]["forward"] > 0 and cat[key]["backward"] > 0, key
    assert split["calls"]["msda.weights_softmax"]["aten::softmax"] == calls
    linears = sum(
        n
        for c in CATEGORIES
        if c.group == "msda"
        for op, n in split["calls"].get(c.key, {}).items()
        if op in ("aten::linear", "aten::addmm")
    )
    assert linears == 4 * calls
    for key in ("msda.locations", "msda.residual", "backbone_neck", "ffn", "norm"):
        assert cat[key]["forward"] > 0 and cat[key]["backward"] > 0, key
    for key in ("self_attn", "heads", "pos_query", "loss_matcher", "data"):
        assert cat[key]["forward"] > 0, key
    assert cat["optimizer"]["other"] > 0 and cat["grad_accumulation"]["backward"] > 0
    # nothing lost or counted twice, and the backward linked
    assert split["sum_ms"] == pytest.approx(split["total_ms"], rel=0.02)
    backward = sum(phases["backward"] for phases in cat.values())
    assert sum(cat["unlinked"].values()) <= 0.01 * backward
    assert split["unattributed_ms"] <= 0.05 * split["total_ms"]


def test_profiled_step_small_detr() -> None:
    split, model, wrapper, hooks = profiled_step(SMALL_DETR)
    check_split(split)
    # the scopes are gone again
    assert hooks == sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    assert "backward" not in vars(wrapper) and "step" not in vars(wrapper)
    assert not active_observers()
    result = {
        "config": "small.py",
        "impl": "cpu",
        "input": "64x48",
        "threads": 2,
        "iters": 1,
        "machine": {"cpu_model": "a CPU", "aten_capability": "AVX2"},
        "versions": {"torch": "t", "mmdet": "d", "mmcv": "c"},
        "commit": "0123456789abc",
        "conditions": {"load_1m": [3.0, 3.5], "wall_s": 9.0, "cpu_s": 4.0},
        "loaded": True,
        "loaded_why": "cpu: load 3.5 > 2 threads + 0.5",
        "loaded_rule": "the rule",
        "profile": {**split, "iterations": 1},
        "totals": totals(split),
        "time_split_ms": dict.fromkeys(
            ("data", "backbone", "msda_fwd", "msda_bwd", "loss_assigner"), 1.0
        )
        | {"transformer_rest": 2.0, "optimizer": 1.0, "other": 0.0},
    }
    table = markdown(result)
    assert "LOADED (cpu: load 3.5" in table and "load average 3 before / 3.5 after" in table
    assert all(f"| {c.label} |" in table for c in CATEGORIES)
    assert f"{4 * split['scopes']['msda.layer']:g} `aten::linear` calls" in table
    # with the fused projections the one GEMM of offsets and weights is the offsets' category
    fused, *_ = profiled_step(SMALL_DETR, layers="projections")
    calls = fused["scopes"]["msda.layer"]
    assert fused["calls"]["msda.offsets_proj"]["aten::linear"] == calls
    assert "aten::linear" not in fused["calls"]["msda.weights_softmax"]


@pytest.mark.slow
def test_profiled_step_small_dino() -> None:
    split, *_ = profiled_step(SMALL_DINO)
    check_split(split)


def test_stock_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="stock"):
        profile_iteration(SMALL_DETR, "stock", 2, 1, str(tmp_path))


# ~60 s on 2 loaded cores: a child process building and training the model twice over.
@pytest.mark.slow
def test_profile_iteration_tool(tmp_path) -> None:
    out = tmp_path / "profile.json"
    args = ["--impl", "cpu", "--size", "96x96", "--iters", "2", "--warmup", "1"]
    result, proc = run_iteration_tool("dev/tools/profile_iteration.py", SMALL_DETR, out, *args)
    assert result["input"] == "96x96" and result["impl"] == "cpu"
    assert result["profile"]["iterations"] == 1 == len(result["profile_iterations"])
    assert result["machine"]["cpu_model"] and len(result["conditions"]["load_1m"]) == 2
    assert isinstance(result["loaded"], bool) and "loaded" in result["loaded_rule"]
    assert len(result["loss"]) == 2 and all(loss == loss for loss in result["loss"])
    check_split(result["profile"])
    table = (tmp_path / "profile.md").read_text()
    assert "| MSDA layers' own work | MSDA op |" in table and table in proc.stdout
