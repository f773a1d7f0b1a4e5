"""The benchmark cases: model shapes, the large ones kept out of the default CPU runs."""

from __future__ import annotations

import pytest

from npudet.benchmark.cases import CASES, LARGE_CASES, make_inputs, parse_case
from npudet.benchmark.device_check import FAST_CASES, FULL_CASES
from npudet.benchmark.harness import DEFAULT_CASES


@pytest.mark.parametrize("name", sorted(LARGE_CASES))
def test_large_case_is_named_and_consistent(name: str) -> None:
    case, pattern = parse_case(f"{name}:uniform")
    assert case is LARGE_CASES[name] and pattern == "uniform"
    if case.encoder:  # an encoder's queries are the pixels of its value map
        assert case.num_queries == case.num_keys
    value, shapes, starts, loc, attn = make_inputs(case, "uniform")
    assert value.shape[1] == int(shapes.prod(1).sum()) == case.num_keys
    assert loc.shape[:2] == attn.shape[:2] == (case.batch, case.num_queries)


def test_large_cases_stay_out_of_default_runs() -> None:
    defaults = [parse_case(s)[0].name for s in DEFAULT_CASES]
    defaults += [parse_case(s)[0].name for s in FULL_CASES + FAST_CASES]
    assert not set(defaults) & set(LARGE_CASES)
    assert not set(CASES) & set(LARGE_CASES)


def test_unknown_case_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown case 'ddetr-huge'.*bev-tsa-base"):
        parse_case("ddetr-huge")
