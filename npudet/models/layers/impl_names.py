"""Validation of MSDA implementation names coming from configs."""

from __future__ import annotations

from npudet.ops.msda import get_impl, msda_impls, registered_impls


def check_impl_name(impl: object, key: str) -> str:
    """Return ``impl`` if it names a usable MSDA implementation or ``"auto"``.

    Raises ``ValueError`` naming the config ``key`` otherwise.
    """
    if not isinstance(impl, str):
        raise ValueError(f"{key}: expected an MSDA implementation name, got {impl!r}")
    if impl == "auto":
        return impl
    if impl not in registered_impls():
        raise ValueError(
            f"{key}: unknown MSDA implementation {impl!r}; expected 'auto' or one of {msda_impls()}"
        )
    reasons = get_impl(impl).unavailable_reasons()
    if reasons:
        raise ValueError(
            f"{key}: MSDA implementation {impl!r} is not usable here ({'; '.join(reasons)}); "
            f"usable: {msda_impls()}"
        )
    return impl
