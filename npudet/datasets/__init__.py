"""The built-in shapes set (no mmdet import needed to generate it), with its semantic maps
for MMSegmentation; the BEV sets live in
:mod:`npudet.bev.infos`."""

from .shapes import CLASSES as SHAPES_CLASSES
from .shapes import make_shapes_dataset
from .shapes_semantic import SEMANTIC_CLASSES, write_semantic_maps

__all__ = ["SEMANTIC_CLASSES", "SHAPES_CLASSES", "make_shapes_dataset", "write_semantic_maps"]
