"""Property-based tests of the public op: random valid problems against a float64 reference,
random malformed calls that must be refused naming the argument.

Valid problems: 1-5 levels of 1x1 to 5x6 maps (1x1 and 1xW included), batch 1-2, 1-3
heads, head_dim 1-70, 1-8 points, 1-3 queries, int32 or int64 level tensors; locations
past the borders and exactly on pixel centres and edges; attention weights of any sign.
Every implementation usable here (``candidate_impls``) runs in float64 against
``grid_sample`` in float64 on the CPU: output and the three gradients, the location
gradient only off exact pixel centres (where bilinear sampling has a kink and any one-sided
derivative is right).

Malformed calls are made right after a valid call of the same signature, so the call plans
(``call_plan``) are in place and must still refuse them, level tensors changed in place
included.

The seed is printed in the run's header (``NPUDET_PROPERTY_SEED`` sets it); the ``slow``
variants run 20x more examples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Tuple

import pytest
import torch
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from msda_util import DEVICE, PROPERTY_SEED, REFERENCE, candidate_impls, run, to_device

from npudet.ops import multi_scale_deformable_attn

IMPLS = candidate_impls(torch.float64)
EXAMPLES = {"triton": 15}  # interpreted on the CPU: slow per call
DEFAULT_EXAMPLES = 60
SLOW_FACTOR = 20


def _settings(examples: int):
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        print_blob=True,
    )


@dataclass(frozen=True)
class Problem:
    shapes: Tuple[Tuple[int, int], ...]
    batch: int
    heads: int
    dim: int
    points: int
    queries: int
    index_dtype: torch.dtype
    on_grid: float  # fraction of coordinates put exactly on pixel centres / edges
    data_seed: int

    def tensors(self) -> Tuple[torch.Tensor, ...]:
        """(value, spatial_shapes, level_start_index, locations, weights), float64 CPU."""
        gen = torch.Generator().manual_seed(self.data_seed)
        spatial = torch.tensor(self.shapes, dtype=self.index_dtype)
        sizes = [h * w for h, w in self.shapes]
        starts = torch.tensor([sum(sizes[:i]) for i in range(len(sizes))], dtype=self.index_dtype)
        levels = len(self.shapes)
        sample = (self.batch, self.queries, self.heads, levels, self.points)
        value = torch.randn(self.batch, sum(sizes), self.heads, self.dim, generator=gen).double()
        loc = (torch.rand(*sample, 2, generator=gen, dtype=torch.float64) * 1.6) - 0.3
        # Pixel centres (i + 0.5) / W and edges i / W, and 0 and 1: k / (2W), k in 0..2W.
        extent = self.extent()
        steps = torch.randint(0, 1 << 20, (*sample, 2), generator=gen).double()
        on_grid = (steps % (2 * extent + 1)) / (2 * extent)
        pick = torch.rand(*sample, 2, generator=gen, dtype=torch.float64) < self.on_grid
        loc = torch.where(pick, on_grid, loc)
        attn = torch.rand(*sample, generator=gen, dtype=torch.float64) * 4 - 2
        return value, spatial, starts, loc, attn

    def extent(self) -> torch.Tensor:
        """(L, 1, 2) (W, H) of each level, shaped to scale (..., L, P, 2) locations."""
        return torch.tensor([[w, h] for h, w in self.shapes], dtype=torch.float64).view(-1, 1, 2)

    def smooth(self, loc: torch.Tensor) -> torch.Tensor:
        """(bs, q, heads, L, P): True where neither coordinate sits on a pixel centre, where
        the location gradient is one-sided."""
        pixel = loc * self.extent() - 0.5
        return ((pixel - pixel.round()).abs() > 1e-9).all(-1)


@st.composite
def problems(draw) -> Problem:
    levels = draw(st.integers(1, 5))
    shapes = tuple((draw(st.integers(1, 5)), draw(st.integers(1, 6))) for _ in range(levels))
    return Problem(
        shapes=shapes,
        batch=draw(st.integers(1, 2)),
        heads=draw(st.integers(1, 3)),
        dim=draw(st.integers(1, 70)),
        points=draw(st.integers(1, 8)),
        queries=draw(st.integers(1, 3)),
        index_dtype=draw(st.sampled_from([torch.int32, torch.int64])),
        on_grid=draw(st.sampled_from([0.0, 0.3, 1.0])),
        data_seed=draw(st.integers(0, 2**31 - 1)),
    )


def check_problem(impl: str, problem: Problem) -> None:
    inputs = problem.tensors()
    want_out, want = run(REFERENCE, inputs, device="cpu")
    got_out, got = run(impl, inputs, device=DEVICE)
    scale = max(want_out.abs().max().item(), 1.0)
    torch.testing.assert_close(got_out, want_out, rtol=1e-9, atol=1e-9 * scale)
    smooth = problem.smooth(inputs[3]).unsqueeze(-1).expand_as(want[1])
    for name, g, w in (
        ("value", got[0], want[0]),
        ("sampling_locations", got[1][smooth], want[1][smooth]),
        ("attention_weights", got[2], want[2]),
    ):
        bound = 1e-9 * max(w.abs().max().item() if w.numel() else 0.0, 1.0)
        torch.testing.assert_close(
            g, w, rtol=1e-9, atol=bound, msg=lambda m, n=name: f"{impl} grad {n}: {m}"
        )


def _property_test(impl: str, examples: int) -> Callable[[], None]:
    @seed(PROPERTY_SEED)
    @_settings(examples)
    @given(problems())
    def body(problem: Problem) -> None:
        check_problem(impl, problem)

    return body


@pytest.mark.parametrize("impl", IMPLS)
def test_random_valid_problems_match_float64_reference(impl):
    _property_test(impl, EXAMPLES.get(impl, DEFAULT_EXAMPLES))()


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLS)
def test_random_valid_problems_match_float64_reference_long(impl):
    _property_test(impl, SLOW_FACTOR * EXAMPLES.get(impl, DEFAULT_EXAMPLES))()


# --- malformed calls -------------------------------------------------------------------

ARG_NAMES = (
    "value",
    "spatial_shapes",
    "level_start_index",
    "sampling_locations",
    "attention_weights",
)


def _replace(i: int, make: Callable) -> Callable:
    def mutate(args: list) -> None:
        args[i] = make(args[i])

    return mutate


def _in_place(i: int, edit: Callable) -> Callable:
    def mutate(args: list) -> None:
        edit(args[i])  # the very tensors the plan last checked: only _version tells

    return mutate


def _zero_first_height(shapes: torch.Tensor) -> None:
    shapes[0, 0] = 0


def _taller_last_level(shapes: torch.Tensor) -> None:
    shapes[-1, 0] += 1


def _wrong_start(starts: torch.Tensor) -> None:
    starts[-1] += 1  # the first level's start (0) when there is one level


def _mutations() -> List[Tuple[str, str, Callable]]:
    """(argument the error must name, what is wrong, mutate(the 5 args as a list))."""
    cat = torch.cat
    return [
        ("value", "rank 3", _replace(0, lambda t: t[..., 0])),
        ("value", "integer dtype", _replace(0, lambda t: t.long())),
        ("value", "a list", _replace(0, lambda t: t.tolist())),
        ("spatial_shapes", "3 columns", _replace(1, lambda t: cat((t, t[:, :1]), 1))),
        ("spatial_shapes", "float dtype", _replace(1, lambda t: t.double())),
        ("spatial_shapes", "a zero height, in place", _in_place(1, _zero_first_height)),
        ("spatial_shapes", "a taller level, in place", _in_place(1, _taller_last_level)),
        ("spatial_shapes", "a new, wider tensor", _replace(1, lambda t: t + t.new_tensor([0, 1]))),
        ("level_start_index", "a wrong start, in place", _in_place(2, _wrong_start)),
        ("level_start_index", "a new, shifted tensor", _replace(2, lambda t: t + 1)),
        ("level_start_index", "one more level", _replace(2, lambda t: cat((t, t[-1:])))),
        ("sampling_locations", "3 coordinates", _replace(3, lambda t: cat((t, t[..., :1]), -1))),
        ("sampling_locations", "another batch", _replace(3, lambda t: cat((t, t)))),
        ("sampling_locations", "integer dtype", _replace(3, lambda t: t.long())),
        ("attention_weights", "one more point", _replace(4, lambda t: cat((t, t[..., :1]), -1))),
        ("attention_weights", "a float", _replace(4, lambda t: 1.0)),
    ]


MUTATIONS = _mutations()


@st.composite
def malformed_calls(draw) -> Tuple[Problem, int]:
    return draw(problems()), draw(st.integers(0, len(MUTATIONS) - 1))


def check_refused(impl: str, problem: Problem, which: int) -> None:
    inputs = list(to_device(problem.tensors()))
    multi_scale_deformable_attn(*inputs, impl=impl)  # the plan of this signature
    name, what, mutate = MUTATIONS[which]
    mutate(inputs)
    try:
        multi_scale_deformable_attn(*inputs, impl=impl)
    except (ValueError, TypeError) as exc:
        assert str(exc).startswith(name) or f"{name}:" in str(exc), f"{impl}, {what}: {exc}"
    else:
        pytest.fail(f"{impl}, {what}: the call was accepted")


def _refusal_test(impl: str, examples: int) -> Callable[[], None]:
    @seed(PROPERTY_SEED)
    @_settings(examples)
    @given(malformed_calls())
    def body(case: Tuple[Problem, int]) -> None:
        check_refused(impl, *case)

    return body


@pytest.mark.parametrize("impl", ["auto", *IMPLS])
def test_random_malformed_calls_are_refused_naming_the_argument(impl):
    _refusal_test(impl, EXAMPLES.get(impl, DEFAULT_EXAMPLES))()


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["auto", *IMPLS])
def test_random_malformed_calls_are_refused_naming_the_argument_long(impl):
    _refusal_test(impl, SLOW_FACTOR * EXAMPLES.get(impl, DEFAULT_EXAMPLES))()


@pytest.mark.parametrize("impl", ["auto", *IMPLS])
def test_impl_that_is_not_a_name_is_refused(impl):
    inputs = to_device(Problem(((2, 3),), 1, 1, 4, 1, 1, torch.int64, 0.0, 0).tensors())
    multi_scale_deformable_attn(*inputs, impl=impl)
    with pytest.raises(TypeError, match="impl: expected a string"):
        multi_scale_deformable_attn(*inputs, impl=[impl])
    with pytest.raises(ValueError, match="impl: unknown MSDA implementation"):
        multi_scale_deformable_attn(*inputs, impl=impl + "x")
