"""Checks of the kernels only the project runs: the Triton launches compiled for CUDA without a
GPU (:mod:`.kernel_compile`, their register tables :mod:`.compile_table`;
``dev/tools/compile_kernels.py``), lowered for Ascend by the worker that ``.venv-ascend`` runs
(:mod:`.ascend_lowering`), and the CPU kernel's gather-only row-load probe (:mod:`.cpu_probe`,
``tools/analysis_tools/benchmark_msda.py --limit``)."""
