"""Built-in data sets (no mmdet import needed to generate them)."""

from .shapes import CLASSES as SHAPES_CLASSES
from .shapes import make_shapes_dataset
from .synthetic_bev import make_bev_dataset

__all__ = ["SHAPES_CLASSES", "make_bev_dataset", "make_shapes_dataset"]
