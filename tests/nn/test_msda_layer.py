"""The npudet MSDA module against mmcv's, and the in-place conversion."""

from __future__ import annotations

import pytest
import torch
from mmcv.ops import MultiScaleDeformableAttention as MMCVMSDA

from npudet.models import MultiScaleDeformableAttention, check_impl_name, convert_msda
from npudet.nn import MSDeformAttn
from npudet.ops import msda_impls

IMPLS = [name for name in ("grid_sample", "cpu") if name in msda_impls()]
SHAPES = torch.tensor([[8, 10], [4, 5], [2, 3]])
STARTS = torch.tensor([0, 80, 100])
NUM_KEYS = 106


# npudet's two MSDA modules: the mmcv subclass mmdet builds, and the torch-only one.
MODULES = {"mmcv-subclass": MultiScaleDeformableAttention, "torch-only": MSDeformAttn}


def _pair(batch_first: bool, impl: str, module: str = "mmcv-subclass"):
    torch.manual_seed(0)
    kw = dict(
        embed_dims=32, num_heads=4, num_levels=3, num_points=2, dropout=0.0, batch_first=batch_first
    )
    ref = MMCVMSDA(**kw)
    ours = MODULES[module](**kw, impl=impl)
    with torch.no_grad():  # non-trivial offsets / weights so that sampling matters
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _inputs(batch_first: bool, ref_dim: int):
    torch.manual_seed(1)
    q = torch.randn(2, 7, 32)
    v = torch.randn(2, NUM_KEYS, 32)
    if not batch_first:
        q, v = q.transpose(0, 1), v.transpose(0, 1)
    ref_pts = torch.rand(2, 7, 3, ref_dim)
    mask = torch.zeros(2, NUM_KEYS, dtype=torch.bool)
    mask[1, -10:] = True
    return q.requires_grad_(), v.requires_grad_(), ref_pts.requires_grad_(), mask


@pytest.mark.parametrize("module", sorted(MODULES))
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("ref_dim", [2, 4])
def test_matches_mmcv_forward_and_backward(
    module: str, impl: str, batch_first: bool, ref_dim: int
) -> None:
    ref, ours = _pair(batch_first, impl, module)
    outs, grads = [], []
    for module in (ref, ours):
        q, v, pts, mask = _inputs(batch_first, ref_dim)
        out = module(
            q,
            value=v,
            query_pos=torch.ones_like(q),
            key_padding_mask=mask,
            reference_points=pts,
            spatial_shapes=SHAPES,
            level_start_index=STARTS,
        )
        out.pow(2).sum().backward()
        outs.append(out)
        grads.append([q.grad, v.grad, pts.grad] + [p.grad for p in module.parameters()])
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    for got, want in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("module", sorted(MODULES))
@pytest.mark.parametrize("ratio", [1.0, 0.5])
def test_same_parameters_and_init_as_mmcv(module: str, ratio: float) -> None:
    torch.manual_seed(0)
    ref = MMCVMSDA(embed_dims=64, num_heads=8, value_proj_ratio=ratio)
    torch.manual_seed(0)
    ours = MODULES[module](embed_dims=64, num_heads=8, value_proj_ratio=ratio, impl="grid_sample")
    assert isinstance(ours, MMCVMSDA) == (module == "mmcv-subclass")
    assert list(ref.state_dict()) == list(ours.state_dict())
    for (name, a), b in zip(ref.state_dict().items(), ours.state_dict().values()):
        assert torch.equal(a, b), name


def test_convert_in_place_keeps_weights() -> None:
    net = torch.nn.Sequential(MMCVMSDA(embed_dims=32, num_heads=4), torch.nn.Linear(2, 2))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    assert convert_msda(net, "grid_sample") == 1
    assert type(net[0]) is MultiScaleDeformableAttention and net[0].impl == "grid_sample"
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert convert_msda(net, "auto") == 1 and net[0].impl == "auto"


def test_bad_impl_names() -> None:
    with pytest.raises(ValueError, match=r"model\.msda\.impl: unknown MSDA implementation 'nope'"):
        check_impl_name("nope", "model.msda.impl")
    for module in MODULES.values():
        with pytest.raises(ValueError, match="impl: unknown"):
            module(embed_dims=32, num_heads=4, impl="nope")
    with pytest.raises(ValueError, match=r"embed_dims: expected a multiple of num_heads \(3\)"):
        MSDeformAttn(embed_dims=32, num_heads=3)
    with pytest.raises(ValueError, match="expected an MSDA implementation name"):
        check_impl_name(3, "model.msda.impl")
    assert check_impl_name("auto", "k") == "auto"
