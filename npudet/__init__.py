"""npudet: fast multi-scale deformable attention for MMDetection 3.x."""

__version__ = "0.1.0"
