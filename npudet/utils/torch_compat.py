"""The torch APIs npudet uses that arrived after torch 2.1, the oldest torch it supports.

Each name here is torch's own function where this torch has it (so ``torch.compile`` sees
the very function it special-cases) and an equivalent on older releases otherwise. Version
checks live here only: the rest of npudet imports these names instead of probing torch.

Tested on torch 2.1.2 (``tests/project/test_oldest_torch.py``) and 2.13.0.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Callable

import torch

__all__ = [
    "assume_constant_result",
    "is_autocast_available",
    "is_compiling",
    "is_exporting",
    "register_fake",
    "register_missing_meta_kernels",
]


def _dynamo_function(name: str) -> Callable:
    """``torch.compiler.<name>`` (torch >= 2.3 for some), else ``torch._dynamo.<name>``, the
    same function under its older home (torch 2.1 and 2.2); importing ``torch._dynamo`` is
    paid only there."""
    found = getattr(torch.compiler, name, None)
    if found is not None:
        return found
    return getattr(importlib.import_module("torch._dynamo"), name)


# The function ``is_compiling`` asks: torch.compiler's (2.3+) or torch._dynamo's. A test that
# states "compiling" patches this name: npudet's modules hold ``is_compiling`` itself.
torch_is_compiling: Callable[[], bool] = _dynamo_function("is_compiling")


def is_compiling() -> bool:
    """Whether ``torch.compile`` / ``torch.export`` is tracing the caller (``torch_is_compiling``
    looked up at each call; dynamo inlines this and folds torch's function to True)."""
    return torch_is_compiling()


def is_exporting() -> bool:
    """Whether ``torch.export`` is tracing the caller: ``torch.compiler.is_exporting``
    (torch >= 2.5); False on older torch, which has no such flag (its export traces as
    ``torch.compile`` does)."""
    exporting = getattr(torch.compiler, "is_exporting", None)
    return bool(exporting is not None and exporting())


# Decorator: dynamo calls the function eagerly and bakes its result into the graph.
assume_constant_result: Callable[[Callable], Callable] = _dynamo_function("assume_constant_result")


def is_autocast_available(device_type: str) -> bool:
    """Whether ``torch.autocast`` supports ``device_type``: ``torch.amp.is_autocast_available``
    (torch >= 2.4), else whether an autocast context for it can be made (older torch raises
    RuntimeError for a device type it has no autocast for)."""
    available = getattr(torch.amp, "is_autocast_available", None)
    if available is not None:
        return available(device_type)
    with warnings.catch_warnings():
        # "CUDA is not available, disabling": the device type is known, just absent here.
        warnings.simplefilter("ignore", UserWarning)
        try:
            torch.autocast(device_type, enabled=False)
        except RuntimeError:
            return False
    return True


def register_fake(qualname: str, fn: Callable, lib: torch.library.Library) -> None:
    """Register ``fn`` as the fake (meta) kernel of operator ``qualname`` (``"ns::name"``,
    defined in ``lib``'s namespace) for fake tensors, ``torch.compile`` and ``torch.export``.

    ``torch.library.register_fake`` (torch >= 2.4), else ``torch.library.impl_abstract``
    (2.2, 2.3), else a Meta kernel registered through ``lib`` (2.1): all three run ``fn`` on
    tensors that carry shapes and dtypes but no data, and ``fn`` must only allocate.
    """
    newest = getattr(torch.library, "register_fake", None)
    if newest is not None:
        newest(qualname, fn, lib=lib)
        return
    abstract = getattr(torch.library, "impl_abstract", None)
    if abstract is not None:
        abstract(qualname, fn, lib=lib)
        return
    # Library.impl names the operator without its namespace (the library's own).
    lib.impl(qualname.split("::", 1)[-1], fn, "Meta")


# Libraries holding this module's Meta kernels: a registration lasts as long as its Library.
_meta_libraries: list = []


def _embedding_bag_dense_backward_meta(
    grad: torch.Tensor,
    indices: torch.Tensor,
    offset2bag: torch.Tensor,
    bag_size: torch.Tensor,
    maximum_indices: torch.Tensor,
    num_weights: int,
    *args,
    **kwargs,
) -> torch.Tensor:
    """``embedding_bag``'s weight gradient: (num_weights, embedding dim) of ``grad``'s dtype."""
    return grad.new_empty((num_weights, grad.size(1)))


def _embedding_bag_per_sample_weights_backward_meta(
    grad: torch.Tensor, weight: torch.Tensor, indices: torch.Tensor, *args, **kwargs
) -> torch.Tensor:
    """``embedding_bag``'s ``per_sample_weights`` gradient: (num_indices,) of ``grad``'s dtype."""
    return grad.new_empty((indices.numel(),))


# Shape-only kernels of ops npudet's implementations call that torch 2.1 has no Meta kernel
# for (both are embedding_bag's backward, which ``gather`` uses); torch >= 2.2 has its own.
_MISSING_META = {
    "_embedding_bag_dense_backward": _embedding_bag_dense_backward_meta,
    "_embedding_bag_per_sample_weights_backward": _embedding_bag_per_sample_weights_backward_meta,
}


def register_missing_meta_kernels() -> None:
    """Give torch the Meta kernels it lacks for the ops npudet's implementations call, so they
    run on fake and meta tensors (``torch.compile``, ``torch.export``, shape-only runs): those
    of ``_MISSING_META`` that this torch has none for. Idempotent."""
    missing = {
        name: kernel
        for name, kernel in _MISSING_META.items()
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta")
    }
    if _meta_libraries or not missing:
        return
    lib = torch.library.Library("aten", "IMPL")
    for name, kernel in missing.items():
        lib.impl(name, kernel, "Meta")
    _meta_libraries.append(lib)
