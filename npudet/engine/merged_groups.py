"""One optimizer step per distinct setting, not per parameter: fewer launches, same training.

mmengine's ``DefaultOptimWrapperConstructor`` with a ``paramwise_cfg`` (Deformable DETR's
``custom_keys``: backbone, ``sampling_offsets``, ``reference_points`` at ``lr_mult=0.1``) gives
every parameter its own param group, and torch's foreach optimizers run each of their
``_foreach_*`` ops once per group: hundreds of small ops per step (on an NPU each a launch).
``MergedGroupsOptimWrapperConstructor`` builds the optimizer as mmengine does (its
``add_params``, the same groups and settings) as a subclass of the configured optimizer whose
``step`` runs over the groups merged by setting (every key but ``params`` equal), then puts
the per-parameter groups back. Outside ``step`` the optimizer is stock's: its
``param_groups``, ``state_dict`` (checkpoints load both ways with stock mmdet), the param
schedulers (which set each group's ``lr``) and the optim wrapper's ``clip_grad`` see one group
per parameter. Each parameter gets the same elementwise arithmetic in the merged step.
"""

from __future__ import annotations

import functools
from typing import Any, Dict, List, Optional, Type

import torch
from mmengine.optim import DefaultOptimWrapperConstructor, OptimWrapper
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS, OPTIMIZERS

# Optimizers whose step treats each group on its own with per-parameter state and elementwise
# arithmetic, so merging groups of equal settings changes no value (LBFGS keeps state per
# optimizer; others are not known to npudet)
MERGEABLE = (
    torch.optim.SGD,
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.Adamax,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.RMSprop,
    torch.optim.Adagrad,
    torch.optim.Adadelta,
)


def _same(a: Any, b: Any) -> bool:
    """Settings equal; a tensor setting (a tensor ``lr``) only when it is the same tensor."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    return type(a) is type(b) and a == b


def merge_param_groups(groups: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """``groups`` with those of equal settings (every key but ``params``) joined, in order of
    first appearance, each group's parameters in their order; the settings dicts are new."""
    merged: List[Dict[str, Any]] = []
    for group in groups:
        for target in merged:
            if target.keys() == group.keys() and all(
                _same(target[k], group[k]) for k in group if k != "params"
            ):
                target["params"] = target["params"] + list(group["params"])
                break
        else:
            merged.append(dict(group, params=list(group["params"])))
    return merged


class MergedGroupsStep:
    """Mixin before a torch optimizer class: ``step`` over the merged param groups."""

    def step(self, closure: Optional[Any] = None) -> Any:
        """The optimizer's step with :func:`merge_param_groups`'s groups in place."""
        stock = self.param_groups
        self.param_groups = merge_param_groups(stock)
        try:
            parent = super().step  # type: ignore[misc]
            # torch wraps each optimizer class's step once to run the step hooks: this
            # class's wrapper already ran them, so the parent's run without them
            if getattr(parent, "hooked", False):
                parent = functools.partial(parent.__wrapped__, self)
            return parent(closure)
        finally:
            self.param_groups = stock


@functools.cache
def merged_step_class(optimizer_cls: type) -> type:
    """``optimizer_cls`` with :class:`MergedGroupsStep`'s step (one class per optimizer)."""
    if issubclass(optimizer_cls, MergedGroupsStep):
        return optimizer_cls
    if not issubclass(optimizer_cls, MERGEABLE):
        names = ", ".join(c.__name__ for c in MERGEABLE)
        raise TypeError(
            f"optim_wrapper.optimizer.type: MergedGroupsOptimWrapperConstructor merges the "
            f"param groups of {names} (or a subclass), got {optimizer_cls.__name__}"
        )
    return type(f"MergedGroups{optimizer_cls.__name__}", (MergedGroupsStep, optimizer_cls), {})


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class MergedGroupsOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """mmengine's ``DefaultOptimWrapperConstructor`` (same config keys, same param groups and
    settings) whose optimizer steps the groups of equal settings together (module docstring).

    Config: ``optim_wrapper=dict(constructor='MergedGroupsOptimWrapperConstructor', ...)``.
    """

    def __call__(self, model: torch.nn.Module) -> OptimWrapper:
        optimizer_cls: Type = self.optimizer_cfg["type"]
        if isinstance(optimizer_cls, str):  # looked up as mmengine's constructor does
            with OPTIMIZERS.switch_scope_and_registry(None) as registry:
                optimizer_cls = registry.get(optimizer_cls)
            if optimizer_cls is None:
                raise KeyError(
                    f"optim_wrapper.optimizer.type: {self.optimizer_cfg['type']!r} is not a "
                    "registered optimizer"
                )
        self.optimizer_cfg = dict(self.optimizer_cfg, type=merged_step_class(optimizer_cls))
        return super().__call__(model)
