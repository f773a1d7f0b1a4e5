"""Short names for the arguments of mmengine's hook methods, so that a hook's signature fits
in one line."""

from typing import Optional

from mmengine.hooks.hook import DATA_BATCH as DataBatch  # Optional[Union[dict, tuple, list]]

Outputs = Optional[dict]  # what a training step returns: its log variables

__all__ = ["DataBatch", "Outputs"]
