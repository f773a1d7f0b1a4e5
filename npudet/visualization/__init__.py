"""Pictures of the BEV detector: a Visualizer in mmdet's VISUALIZERS and its test-time hook."""

from .bev_visualization_hook import BEVVisualizationHook
from .bev_visualizer import BEVLocalVisualizer

__all__ = ["BEVLocalVisualizer", "BEVVisualizationHook"]
