"""npudet's op library; imports only torch (no mmdet/mmengine)."""

from .msda import msda_impls, multi_scale_deformable_attn, prepare

__all__ = ["msda_impls", "multi_scale_deformable_attn", "prepare"]
