"""Offsets are int64: a value tensor of more than 2**31 elements, read and written at its end.

One sample sits exactly on the centre of the last pixel, so the output is that pixel's row
and its value gradient lands on that row alone: an offset that wraps at 2**31 reads or
writes elsewhere. ``cpu``: forward on the CPU (slow, 8.7 GB). ``triton``: forward and
grad_value on a CUDA device (``NPUDET_TEST_DEVICE=cuda``, about 30 GB of GPU memory). The
same check on a small map runs by default for every implementation on the test device, so
the large runs check what the small one shows the check catches.
"""

from __future__ import annotations

from typing import Tuple

import pytest
import torch
from msda_util import DEVICE, device_impls, msda

# H and W powers of two: the last pixel's centre, ((W - 0.5) / W, (H - 0.5) / H), is exact
# in float32, so its bilinear weight is exactly 1 and every other corner's exactly 0. 2**25
# pixels of 64 channels would end at element 2**31 - 1; 65 is the smallest head_dim past it
# (2,181,038,080 elements, 8.7 GB of float32).
HEIGHT, WIDTH, DIM = 32768, 1024, 65


def _last_pixel_case(height: int, width: int, dim: int, device: str) -> Tuple[torch.Tensor, ...]:
    """(value (1, H*W, 1, dim) zeros but the last pixel's row 0..dim-1, shapes, starts,
    locations (1, 1, 1, 1, 1, 2) at the last pixel's centre, weights (1, 1, 1, 1, 1) ones)."""
    value = torch.zeros(1, height * width, 1, dim, device=device)
    value[0, -1, 0] = torch.arange(dim, dtype=torch.float32, device=device)
    shapes = torch.tensor([[height, width]], device=device)
    starts = torch.tensor([0], device=device)
    centre = [(width - 0.5) / width, (height - 0.5) / height]
    loc = torch.tensor(centre, device=device).view(1, 1, 1, 1, 1, 2)
    attn = torch.ones(1, 1, 1, 1, 1, device=device)
    return value, shapes, starts, loc, attn


def _check_last_pixel(impl: str, height: int, width: int, dim: int, backward: bool) -> None:
    """``impl`` reads the last pixel's row; with ``backward`` it writes its gradient there only."""
    value, shapes, starts, loc, attn = _last_pixel_case(height, width, dim, DEVICE)
    value.requires_grad_(backward)
    out = msda(value, shapes, starts, loc, attn, impl=impl)
    torch.testing.assert_close(out.detach().view(dim).cpu(), torch.arange(dim, dtype=torch.float32))
    if not backward:
        return
    grad = torch.linspace(1.0, 2.0, dim, device=DEVICE).view(1, 1, dim)
    (grad_value,) = torch.autograd.grad(out, value, grad)
    torch.testing.assert_close(grad_value[0, -1, 0].cpu(), grad.view(dim).cpu())
    # Nothing written anywhere else: the whole tensor's L1 norm is that row's.
    total = torch.linalg.vector_norm(grad_value, ord=1).item()
    assert total == pytest.approx(grad.abs().sum().item(), rel=1e-5)


@pytest.mark.parametrize("impl", device_impls())
def test_last_pixel_check_on_a_small_map(impl: str) -> None:
    _check_last_pixel(impl, 16, 8, 8, backward=True)


def test_the_check_catches_a_wrong_row(monkeypatch) -> None:
    """A value gradient that also lands one row early fails the norm check."""
    real = torch.autograd.grad

    def leaky(out, inputs, grad):
        (grad_value,) = real(out, inputs, grad)
        grad_value[0, -2, 0] += grad.view(-1)
        return (grad_value,)

    monkeypatch.setattr(torch.autograd, "grad", leaky)
    with pytest.raises(AssertionError):
        _check_last_pixel("grid_sample", 16, 8, 8, backward=True)


def test_shape_passes_two_to_the_31():
    assert HEIGHT * WIDTH * DIM > 2**31 and (HEIGHT - 1) * WIDTH * DIM > 2**31


@pytest.mark.slow
def test_cpu_forward_reads_past_two_to_the_31_elements():
    if DEVICE != "cpu" or "cpu" not in device_impls():
        pytest.skip("the cpu kernel on the CPU")
    _check_last_pixel("cpu", HEIGHT, WIDTH, DIM, backward=False)


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device: NPUDET_TEST_DEVICE=cuda")
def test_triton_forward_and_grad_value_past_two_to_the_31_elements():
    assert "triton" in device_impls(), "triton is not usable on this CUDA machine"
    free, _ = torch.cuda.mem_get_info()
    # value, the kernel's float32 grad buffer and grad_value: 8.1 GiB each, plus slack.
    if free < 30 * 2**30:
        pytest.skip(f"needs 30 GiB of free GPU memory, {free / 2**30:.0f} GiB free")
    _check_last_pixel("triton", HEIGHT, WIDTH, DIM, backward=True)
