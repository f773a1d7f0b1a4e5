"""The GPU kit: one prepared run that measures npudet on a short-lived, offline GPU machine.

``run`` (the orchestrator) runs each part in a child process of its own (``child``), within a
time budget, and writes ``<gpu>.json`` and ``<gpu>.md``: the device check, the MSDA benchmark
on the model cases and the training-size cases in float32 and half precision, a
Deformable-DETR-sized training iteration (``ddetr``), ``torch.compile`` of one encoder layer,
with mmcv's CUDA kernel built on the machine from mmcv's sdist (``ops.msda.mmcv_cuda_lib``).
It runs from a checkout (it calls ``tools/misc/check_device.py`` and
``tools/analysis_tools/benchmark_msda.py``) and needs neither mmcv, mmdet nor mmengine.
``dev/tools/gpu_kit.py`` is its command line.
"""
