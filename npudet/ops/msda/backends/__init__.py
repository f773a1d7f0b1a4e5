"""One module per MSDA implementation; importing this package registers them all."""

from . import cpu, gather, gather_det, grid_sample, mmcv, npu, triton  # noqa: F401  (register)
