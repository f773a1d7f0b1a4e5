"""Bad input to the MSDA op: a clear error naming the argument, for every implementation."""

from __future__ import annotations

import pytest
import torch
from msda_util import device_impls, msda, random_inputs, to_device

from npudet.ops.msda import MSDAImpl, get_impl, register, select_impl, validate_inputs
from npudet.ops.msda.registry import _REGISTRY


def call(inputs, impl="auto"):
    return msda(*inputs, impl=impl)


def replaced(inputs, index, tensor):
    items = list(inputs)
    items[index] = tensor
    return tuple(items)


BAD = {
    "value-rank": (0, lambda t: t[0], ValueError, "value"),
    "loc-rank": (3, lambda t: t[..., 0], ValueError, "sampling_locations"),
    "loc-batch": (3, lambda t: torch.cat((t, t)), ValueError, "sampling_locations"),
    "loc-heads": (3, lambda t: t[:, :, :1], ValueError, "sampling_locations"),
    "loc-levels": (3, lambda t: t[:, :, :, :1], ValueError, "sampling_locations"),
    "attn-points": (4, lambda t: t[..., :1], ValueError, "attention_weights"),
    "attn-queries": (4, lambda t: t[:, :1], ValueError, "attention_weights"),
    "shapes-float": (1, lambda t: t.float(), TypeError, "spatial_shapes"),
    "shapes-cols": (1, lambda t: t[:, :1], ValueError, "spatial_shapes"),
    "shapes-keys": (1, lambda t: t * 2, ValueError, "spatial_shapes"),
    "shapes-zero": (1, lambda t: t * 0, ValueError, "spatial_shapes"),
    "starts-wrong": (2, lambda t: t + 1, ValueError, "level_start_index"),
    "starts-len": (2, lambda t: t[:1], ValueError, "level_start_index"),
    "value-int": (0, lambda t: t.long(), TypeError, "value"),
    # Mixed float dtypes are accepted (autocast); a non-float one is not.
    "attn-dtype": (4, lambda t: t.long(), TypeError, "attention_weights"),
    "not-a-tensor": (0, lambda t: t.tolist(), TypeError, "value"),
    "device": (4, lambda t: t.to("meta"), ValueError, "device"),
}


@pytest.mark.parametrize("impl", ["auto", *device_impls()])
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_names_the_argument(impl, case):
    """On the test device (NPUDET_TEST_DEVICE), for every implementation it has."""
    index, change, error, name = BAD[case]
    inputs = to_device(random_inputs())
    with pytest.raises(error, match=name):
        call(replaced(inputs, index, change(inputs[index])), impl=impl)


def test_unknown_impl_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown MSDA implementation 'fast'.*grid_sample"):
        call(random_inputs(), impl="fast")


def test_impl_that_cannot_take_the_inputs_says_why():
    inputs = tuple(t.to("meta") for t in random_inputs())
    info = validate_inputs(*inputs, check_values=False)
    with pytest.raises(ValueError, match=r"impl='cpu' cannot run these inputs: device 'meta'"):
        select_impl("cpu", info)


class _Limited(MSDAImpl):
    """``gather`` up to head_dim 32 (``auto`` checks it against grid_sample before use)."""

    NAME = "test_limited"
    DEVICES = ("cpu",)
    MAX_HEAD_DIM = 32

    def forward(self, *args):
        return get_impl("gather").forward(*args)


def test_auto_error_lists_every_candidate(monkeypatch):
    limited = _Limited()
    monkeypatch.setitem(_REGISTRY, limited.NAME, limited)
    monkeypatch.setattr("npudet.ops.msda.auto.AUTO_PRIORITY", {"cpu": [limited.NAME]})
    info = validate_inputs(*random_inputs(dim=33))
    with pytest.raises(ValueError, match=r"test_limited: head_dim 33 > 32"):
        select_impl("auto", info)
    assert select_impl("auto", validate_inputs(*random_inputs(dim=4))) is limited


def test_register_rejects_nameless():
    with pytest.raises(ValueError, match="NAME"):
        register(MSDAImpl())


def test_get_impl_returns_registered():
    assert get_impl("gather").NAME == "gather"
