"""One profiled run of the iteration benchmark in its own process.

``python -m npudet_dev.ablation.op_profile.child SPEC_JSON`` trains as
:mod:`..iteration_child` does (the same spec, plus ``profile_warmup``: the iterations left
unprofiled) with :class:`~.hook.OpProfileHook` registered, and adds ``op_profile`` (one
:func:`.split.attribute_iteration` split per profiled iteration) to ``record.json``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from npudet.ablation.worker import save_record, spec_main

from .. import iteration_child
from .hook import OpProfileHook


def run(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Train and profile as ``spec`` says; returns (and writes) the record."""
    profiler = OpProfileHook(int(spec["profile_warmup"]))
    record = iteration_child.run(spec, hooks=[profiler])
    return save_record(spec, {**record, "op_profile": profiler.splits})


def main(argv: Optional[List[str]] = None) -> None:
    spec_main(run, "npudet_dev.ablation.op_profile.child", argv)


if __name__ == "__main__":
    main()
