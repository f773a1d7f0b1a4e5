"""BEV multi-camera dataset and transforms, registered in the mmdet registries.

Use with ``custom_imports = dict(imports=['npudet.bev.datasets'])``.
"""

from .dataset import BEVDataset
from .transforms import LoadMultiViewImages, PackBEVInputs, ResizeMultiViewImages

__all__ = ["BEVDataset", "LoadMultiViewImages", "PackBEVInputs", "ResizeMultiViewImages"]
