"""The dispatch counter of a training iteration on the simulated NPU
(npudet_dev.ablation.dispatch_count, dev/tools/count_dispatch.py).

By default: the attribution rules on hand-made stacks (innermost frame of interest wins,
mmengine's decorators looked past, the heads' loss methods, the benchmark's own hooks left
out); on the simulated npu, in process: each kind of host sync counted and nothing else
(a host-to-device copy, views), backward ops attributed to the forward op's source through
its node, a vendor double counted as one op; the table's columns. Slow: the tool end to end
on the small Deformable DETR (its own processes on the simulated npu, JSON and table).
"""

from __future__ import annotations

import pytest
import torch
from iteration_tool_util import run_iteration_tool
from npu_sim_util import simulated_npu  # noqa: F401  (the fixture)
from plugin_util import SMALL_DETR
from table_util import markdown_rows

from npudet_dev.ablation.dispatch_count.counter import SOURCES, DispatchCounter, attribute
from npudet_dev.ablation.dispatch_count.report import markdown
from npudet_dev.ablation.dispatch_count.run import per_iteration

pytestmark = pytest.mark.dev

SITE = "/x/site-packages/"


def test_the_innermost_frame_of_interest_decides():
    frames = [  # innermost first
        ("/x/torch/nn/functional.py", 10, "linear"),
        (SITE + "mmengine/utils/misc.py", 395, "new_func"),  # a decorator: looked past
        (SITE + "mmdet/models/task_modules/assigners/hungarian_assigner.py", 126, "assign"),
        (SITE + "mmdet/models/dense_heads/detr_head.py", 400, "_get_targets_single"),
        (SITE + "mmengine/runner/loops.py", 1, "run_iter"),
    ]
    assert attribute(frames) == (
        "matcher",
        "mmdet/models/task_modules/assigners/hungarian_assigner.py:126 assign",
    )
    assert attribute(frames[:2] + frames[3:])[0] == "losses"  # a head's target bookkeeping
    head_forward = (SITE + "mmdet/models/dense_heads/detr_head.py", 1, "forward")
    assert attribute([head_forward])[0] == "transformer_heads"
    assert attribute(frames[:2] + frames[4:])[0] == "loop"
    assert attribute([("/x/npudet/nn/deformable_attention.py", 1, "f")])[0] == "layers"
    assert attribute([("/x/dev/npudet_dev/ablation/time_split.py", 1, "f")])[0] == "bench"
    assert attribute([("/x/torch/_tensor.py", 1, "f")]) == ("other", "?")


def _in_file(path: str, source: str):
    """The function ``f`` of ``source``, as if defined in ``path`` (its frames name it)."""
    scope: dict = {"torch": torch}
    exec(compile(source, path, "exec"), scope)
    return scope["f"]


@pytest.mark.usefixtures("simulated_npu")
def test_host_syncs_are_counted_by_kind_and_source():
    loss = _in_file(SITE + "mmdet/models/losses/l.py", "def f(x):\n    return (x * x).sum()\n")
    counter = DispatchCounter("npu")
    x = torch.arange(6.0).npu().requires_grad_()
    with counter:
        y = x.detach()[1:]  # a view
        mask = y > 2
        y.sum().item()
        y.cpu()
        y.tolist()
        y.nonzero()
        y[mask]
        torch.ones(3).npu()  # to the device: an op, no sync
        loss(x).backward()
    counts = counter.tally.as_dict()
    assert counts["sync_kinds"] == {
        "item": 1,
        "copy_to_host": 2,
        "data_dependent_shape": 1,
        "bool_index": 1,
    }
    assert counts["syncs"] == 5 and counts["host_to_device"] == 1
    assert counts["views"] >= 2  # detach, slice
    assert counts["backward_ops"] > 0
    # the backward of x * x and of sum: attributed to the loss through their nodes
    losses = counts["by_source"]["losses"]
    assert losses["ops"] >= 2 + counts["backward_ops"] - counts["by_source"]["autograd"]["ops"]
    assert set(counts["by_source"]) == set(SOURCES)


@pytest.mark.usefixtures("simulated_npu")
def test_a_vendor_double_counts_as_one_op():
    counter = DispatchCounter("npu")
    ones = torch.ones(4, device="npu")

    def kernel(t: torch.Tensor) -> torch.Tensor:
        return (t * 2).sum().item() + t.cos()

    one = counter.opaque(kernel, "vendor.kernel")
    with counter:
        one(ones)
    counts = counter.tally.as_dict()
    assert counts["ops"] == 1 and counts["syncs"] == 0
    assert counts["ops_by_name"] == {"vendor.kernel": 1}


def _count(ops: int, syncs: int) -> dict:
    by_source = {s: {"ops": 0, "views": 0, "syncs": 0} for s in SOURCES}
    by_source["matcher"] = {"ops": ops, "views": 1, "syncs": syncs}
    return {
        "ops": ops, "views": 1, "syncs": syncs, "backward_ops": 0, "host_to_device": 0,
        "by_source": by_source, "sync_kinds": {"copy_to_host": syncs},
        "top_op_sites": [["matcher", "a.py:1 f", ops]],
        "sync_sites": [["matcher", "a.py:1 f", "copy_to_host", "_to_copy", syncs]],
    }  # fmt: skip


def test_table_has_the_issue_columns():
    runs = {}
    for impl, ops in (("stock", 100), ("auto", 50)):
        runs[impl] = {
            "per_iteration": per_iteration([_count(ops, 3), _count(ops, 3)]),
            "device": "Simulated Ascend NPU",
            "loss": [2.5, 2.25],
            "ops_vs_reference": ops / 100,
        }
    result = dict(
        config="configs/x.py", input="320x320", batch_size=1, iters=2, warmup=1, seed=0,
        versions=dict(torch="t", mmdet="d", mmcv="c"), commit="0" * 40,
        command="python dev/tools/count_dispatch.py configs/x.py", reference="stock", runs=runs,
    )  # fmt: skip
    text = markdown(result)
    assert "never times" in text and "python dev/tools/count_dispatch.py" in text
    assert "- `auto`: 2.500000 2.250000" in text
    rows = {r["impl"]: r for r in markdown_rows(text)}
    assert rows["`auto`"]["ops per iteration"].startswith("50 (1 views), 0.50x stock")
    assert rows["`stock`"]["host syncs per iteration"] == "3"
    assert rows["`stock`"]["assigner / matcher: ops / syncs"] == "100 / 3"


@pytest.mark.slow
def test_tool_counts_the_small_detr_on_npu(tmp_path):
    out = tmp_path / "dispatch.json"
    result, _ = run_iteration_tool(
        "dev/tools/count_dispatch.py", SMALL_DETR, out, "--impls", "auto", "--size", "64x64",
        "--threads", "1",
    )  # fmt: skip
    run = result["runs"]["auto"]
    assert run["device"].startswith("Simulated Ascend NPU")
    counts = run["per_iteration"]
    assert counts["ops"] > 1000 and counts["by_source"]["layers"]["syncs"] == 0
    # the level sizes noted by the detector: no read of the level tensor in the transformer
    assert counts["by_source"]["transformer_heads"]["syncs"] == 0
    assert counts["by_source"]["matcher"]["syncs"] > 0  # the cost matrices' copies
    assert (tmp_path / "dispatch.md").read_text().count("| `auto` |") == 1
