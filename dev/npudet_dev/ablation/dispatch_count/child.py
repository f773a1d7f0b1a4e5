"""One counted run of the iteration benchmark in its own process, on the simulated NPU.

``python -m npudet_dev.ablation.dispatch_count.child SPEC_JSON`` (with
``NPUDET_SIMULATED_NPU=1``: the runner puts the model on ``npu``) trains as
:mod:`..iteration_child` does, bare (no benchmark work inside the model), with
:class:`~.hook.DispatchCountHook` counting the iterations after ``count_warmup``, and adds
``dispatch`` (one count per counted iteration) and ``device`` to ``record.json``. An ``impl``
named ``IMPL:batched_matching`` runs IMPL with :data:`BATCHED_MATCHING`.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from npudet.ablation.worker import save_record, spec_main

from .. import iteration_child
from .hook import DispatchCountHook

# npudet's switch that prefetches a loss computation's Hungarian matchings in one host round trip
BATCHED_MATCHING = {"model.train_cfg.assigner.type": "BatchedHungarianAssigner"}
SUFFIX = ":batched_matching"


def vendor_doubles() -> tuple:
    """The simulated DrivingSDK binding's functions, each one kernel on an NPU (its double
    computes with a reference of many ops): (module, function, op name) for the hook."""
    try:
        from mx_driving import _C
    except ImportError:  # no simulation here: nothing to count as one op
        return ()
    names = ("multi_scale_deformable_attn", "multi_scale_deformable_attn_backward")
    return tuple((_C, name, f"mx_driving.{name}") for name in names)


def run(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Train and count as ``spec`` says; returns (and writes) the record."""
    import torch

    hook = DispatchCountHook(int(spec["count_warmup"]), "npu", vendor_doubles())
    run_spec = {**spec, "bare": True}
    if spec["impl"].endswith(SUFFIX):
        run_spec.update(impl=spec["impl"][: -len(SUFFIX)], cfg_options=BATCHED_MATCHING)
    record = iteration_child.run(run_spec, hooks=[hook])
    on_npu = hasattr(torch, "npu") and torch.npu.is_available()
    device = torch.npu.get_device_name() if on_npu else "cpu"
    return save_record(spec, {**record, "dispatch": hook.iterations, "device": device})


def main(argv: Optional[List[str]] = None) -> None:
    spec_main(run, "npudet_dev.ablation.dispatch_count.child", argv)


if __name__ == "__main__":
    main()
