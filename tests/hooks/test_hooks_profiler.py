"""MSDAProfilerHook on a real mmengine Runner, and the op-level timer it uses."""

from __future__ import annotations

import json
import os

import torch
from hooks_util import toy_runner
from msda_util import random_inputs

import npudet.hooks  # noqa: F401  (register)
from npudet.hooks.msda_timer import MSDATimer
from npudet.ops import multi_scale_deformable_attn
from npudet.ops.msda.observe import active_observers, observing


def test_timer_counts_calls_and_times_forward_and_backward():
    inputs = [t.requires_grad_() if t.is_floating_point() else t for t in random_inputs()]
    plain = multi_scale_deformable_attn(*inputs, impl="grid_sample")
    with observing(MSDATimer()) as timer:
        out = multi_scale_deformable_attn(*inputs, impl="grid_sample")
        out2 = multi_scale_deformable_attn(*inputs, impl="grid_sample")
        assert timer.calls == 2 and timer.forward_s > 0 and timer.backward_s == 0
        (out.sum() + out2.sum()).backward()
    assert timer.backward_s > 0
    assert torch.equal(out, plain)
    assert active_observers() == []


def test_timer_without_grad_times_forward_only():
    with torch.no_grad(), observing(MSDATimer()) as timer:
        multi_scale_deformable_attn(*random_inputs())
    assert timer.calls == 1 and timer.forward_s > 0 and timer.backward_s == 0


def test_profiler_hook_logs_per_iteration_and_summarises(tmp_path):
    runner = toy_runner(str(tmp_path), [{"type": "MSDAProfilerHook"}], max_iters=4)
    runner.train()
    hook = next(h for h in runner.hooks if type(h).__name__ == "MSDAProfilerHook")
    assert len(hook.records) == 4
    for record in hook.records:
        assert record["calls"] == 2  # two layers, one call each
        assert record["fwd_ms"] > 0 and record["bwd_ms"] > 0
        msda_ms = record["fwd_ms"] + record["bwd_ms"]
        assert msda_ms < record["iter_ms"]
        assert abs(record["share"] - 100 * msda_ms / record["iter_ms"]) < 1e-6
    assert active_observers() == []

    with open(os.path.join(runner.log_dir, "msda_profile.json")) as f:
        summary = json.load(f)
    assert summary["iters"] == 3 and summary["calls"] == 2 and 0 < summary["share"] < 100

    # The visualizer's local backend got the scalars of every iteration.
    scalars = os.path.join(runner.log_dir, "vis_data", "scalars.json")
    with open(scalars) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    logged = [line for line in lines if "msda_fwd_ms" in line]
    assert len(logged) == 4
    assert all(line["msda_calls"] == 2 and line["msda_bwd_ms"] > 0 for line in logged)
