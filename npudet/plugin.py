"""npudet's one entry point for mmdet configs: ``custom_imports=dict(imports=['npudet.plugin'])``.

Importing it registers everything the configs name in the mmdet / mmengine registries: the
2D detectors (``npudet.models``), the BEV detector, its dataset, transforms and metric
(``npudet.bev``), ``FastCocoMetric`` (``npudet.evaluation``), every training hook
(``npudet.hooks``), the BEV visualizer and its hook (``npudet.visualization``) and the CPU
mixed-precision optim wrapper; and, through ``npudet.engine``, allow-lists mmengine's checkpoint
types for torch's weights-only loader and routes the op library's log lines to the run's log. It
is the top layer: nothing in npudet imports it.
"""

import npudet.bev.datasets  # noqa: F401  (BEVDataset and the multi-view transforms)
import npudet.bev.evaluation  # noqa: F401  (BEVDetMetric)
import npudet.bev.models  # noqa: F401  (BEVFormer and its parts)
import npudet.engine  # noqa: F401  (CPUAmpOptimWrapper, checkpoint allow-list, MSDA log)
import npudet.evaluation  # noqa: F401  (FastCocoMetric)
import npudet.hooks  # noqa: F401  (every npudet hook)
import npudet.models  # noqa: F401  (DeformableDETR / DINO on npudet's MSDA)
import npudet.visualization  # noqa: F401  (BEVLocalVisualizer, BEVVisualizationHook)
