"""npudet's one entry point for mmdet configs: ``custom_imports=dict(imports=['npudet.plugin'])``.

Importing it registers everything the configs name in the mmdet / mmengine registries: the
2D detectors and ``MSDASwitchHook`` (``npudet.models``; the hook in mmengine's root ``HOOKS``,
so mmseg's and every other toolbox's scope find it), the BEV detector, its dataset,
transforms and metric (``npudet.bev``), ``FastCocoMetric`` (``npudet.evaluation``), every
training hook (``npudet.hooks``), the BEV visualizer and its hook (``npudet.visualization``),
the CPU mixed-precision optim wrapper (``npudet.engine.amp``) and the optim wrapper
constructor that steps equal param groups together (``npudet.engine.merged_groups``). It is
the top layer:
nothing in npudet imports it.

mmdet names it overrides (``force=True``), all in mmdet's ``MODELS``, each by mmdet's class
behind ``MSDAModel`` (``npudet.models.detectors``: same parameters and state_dict keys, one more
config key, ``model.msda``): ``DeformableDETR``, ``DINO``, ``DDQDETR``, ``GroundingDINO``,
``Mask2Former``, ``Mask2FormerVideo``; and ``DeformableDETRHead``, mmdet's head that
prefetches its Hungarian matchings in one host round trip when its assigner is
``BatchedHungarianAssigner`` (``npudet.models.heads``; no parameter added, mmdet's behaviour
with any other assigner). Every other name it registers is new (registered without ``force``,
so a clash would raise).

What else the import changes in the process:

- pickling (``npudet.engine.checkpoint``): ``copyreg`` makes mmengine's ``HistoryBuffer``
  pickle as plain lists, and ``torch.serialization.add_safe_globals`` allow-lists
  ``HistoryBuffer`` and numpy's array, scalar and dtype reconstruction, so torch's
  weights-only loader (torch >= 2.6's default) reads checkpoints npudet saves.
- logging (``npudet.engine.msda_log``): the ``npudet`` logger (the op library's: ``auto``'s
  choice, failed verifications) gets a handler passing INFO and above to mmengine's current
  ``MMLogger``, its level set to INFO if higher, and stops propagating to the root logger.
- torch operators (``npudet.ops``): the ``npudet::`` operators of the Triton implementation
  are defined (npudet's own namespace); on torch 2.1 only, Meta kernels are added for
  ``aten::_embedding_bag_dense_backward`` and ``aten::_embedding_bag_per_sample_weights_backward``,
  which that torch lacks (``gather`` on fake tensors).
"""

import npudet.bev.datasets  # noqa: F401  (BEVDataset and the multi-view transforms)
import npudet.bev.evaluation  # noqa: F401  (BEVDetMetric)
import npudet.bev.models  # noqa: F401  (BEVFormer and its parts)
import npudet.engine  # noqa: F401  (CPUAmpOptimWrapper, checkpoint allow-list, MSDA log)
import npudet.evaluation  # noqa: F401  (FastCocoMetric)
import npudet.hooks  # noqa: F401  (every npudet hook)
import npudet.models  # noqa: F401  (mmdet's MSDA detectors on npudet's MSDA)
import npudet.visualization  # noqa: F401  (BEVLocalVisualizer, BEVVisualizationHook)
