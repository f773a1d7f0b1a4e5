"""BEV multi-camera dataset and transforms, registered in the mmdet registries.

``custom_imports=dict(imports=['npudet.plugin'])`` imports it.
"""

from .dataset import BEVDataset
from .transforms import LoadMultiViewImages, PackBEVInputs, ResizeMultiViewImages

__all__ = ["BEVDataset", "LoadMultiViewImages", "PackBEVInputs", "ResizeMultiViewImages"]
