"""mmengine side of npudet: hooks (registered in mmdet's HOOKS) and checkpoint loading.

Importing it (``custom_imports=dict(imports=['npudet.engine'])``) registers the hooks
and allow-lists mmengine's checkpoint types for torch's weights-only loader.
"""

from .checkpoint import allow_mmengine_checkpoints
from .coco_summary_hook import CocoSummaryHook, coco_table
from .eval_progress_hook import EvalProgressHook
from .rng_state_hook import RNGStateHook

allow_mmengine_checkpoints()

__all__ = [
    "CocoSummaryHook",
    "EvalProgressHook",
    "RNGStateHook",
    "allow_mmengine_checkpoints",
    "coco_table",
]
