"""The op-level observer mechanism the hooks are built on."""

from __future__ import annotations

import torch
from msda_util import random_inputs

from npudet.ops import multi_scale_deformable_attn
from npudet.ops.msda import observe, select_impl, validate_inputs
from npudet.ops.msda.observe import MSDAObserver, observing, suspended


class _Log(MSDAObserver):
    def __init__(self, tag, log, scale=1.0):
        self.tag, self.log, self.scale = tag, log, scale

    def around(self, call, run):
        self.log.append((self.tag, call.impl))
        return run(call.with_inputs(attention_weights=call.attention_weights * self.scale))


def test_observers_nest_in_order_and_may_change_inputs():
    inputs = random_inputs()
    plain = multi_scale_deformable_attn(*inputs, impl="gather")
    log = []
    with observing(_Log("outer", log)), observing(_Log("inner", log, scale=2.0)):
        out = multi_scale_deformable_attn(*inputs, impl="gather")
        with suspended():
            quiet = multi_scale_deformable_attn(*inputs, impl="gather")
        assert len(observe.active_observers()) == 2
    assert log == [("outer", "gather"), ("inner", "gather")]
    torch.testing.assert_close(out, 2 * plain)  # linear in the weights
    assert torch.equal(quiet, plain)
    assert observe.active_observers() == []


def test_auto_reports_the_chosen_implementation():
    log = []
    with observing(_Log("only", log)):
        multi_scale_deformable_attn(*random_inputs())
    assert log[0][1] == select_impl("auto", validate_inputs(*random_inputs())).NAME
