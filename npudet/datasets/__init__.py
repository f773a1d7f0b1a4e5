"""The built-in shapes set (no mmdet import needed to generate it); the BEV sets live in
:mod:`npudet.bev.infos`."""

from .shapes import CLASSES as SHAPES_CLASSES
from .shapes import make_shapes_dataset

__all__ = ["SHAPES_CLASSES", "make_shapes_dataset"]
