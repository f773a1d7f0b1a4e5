"""A deliberately wrong MSDA implementation, the negative control of the comparisons that
the real implementations must pass (``test_train_eval_e2e.py``).

``shifted_for_test`` is ``grid_sample`` with every sampling location moved by ``SHIFT`` (in
the normalized [0, 1] coordinates): a tenth of a pixel on the finest map of a 256-pixel
image (stride 8, 32 columns), the size of a subtle indexing or rounding bug.

    python tests/tools/msda_perturbed.py tools/test.py CONFIG CKPT --msda-impl shifted_for_test ...

registers it in this process and then runs the tool with the rest of the arguments.
"""

from __future__ import annotations

import runpy
import sys

import torch

from npudet.ops.msda import MSDAImpl, get_impl
from npudet.ops.msda.registry import register

NAME = "shifted_for_test"
SHIFT = 0.1 / 32


class ShiftedForTest(MSDAImpl):
    """``grid_sample`` sampling ``SHIFT`` to the right and down of where it is asked."""

    NAME = NAME
    DEVICES = ("cpu",)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        """(value, spatial_shapes, level_start_index, locations, weights) -> output."""
        value, shapes, starts, locations, weights = inputs
        return get_impl("grid_sample").forward(value, shapes, starts, locations + SHIFT, weights)


def main() -> None:
    register(ShiftedForTest())
    tool = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(tool, run_name="__main__")


if __name__ == "__main__":
    main()
