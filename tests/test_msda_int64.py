"""The fused CPU kernel indexes with int64: a value tensor of more than 2**31 elements."""

from __future__ import annotations

import pytest
import torch

from npudet.ops import multi_scale_deformable_attn


@pytest.mark.slow
def test_cpu_forward_reads_past_two_to_the_31_elements():
    height, width, dim = 32776, 1024, 64  # 2**31 + 2**19 elements, 8.6 GB of float32
    value = torch.zeros(1, height * width, 1, dim)
    assert value.numel() > 2**31
    value[0, -1, 0] = torch.arange(dim, dtype=torch.float32)  # the very last pixel
    shapes = torch.tensor([[height, width]])
    starts = torch.tensor([0])
    loc = torch.tensor([(width - 0.5) / width, (height - 0.5) / height]).view(1, 1, 1, 1, 1, 2)
    attn = torch.ones(1, 1, 1, 1, 1)
    out = multi_scale_deformable_attn(value, shapes, starts, loc, attn, impl="cpu")
    torch.testing.assert_close(
        out.view(dim), torch.arange(dim, dtype=torch.float32), atol=1e-2, rtol=1e-3
    )
