"""``torch_npu.npu.profile``: torch_npu's legacy profiler context, over torch's profiler.

On Ascend it drives CANN's msprof and writes its data under ``profiler_result_path``; mmengine's
``NPUProfilerHook`` enters it at one iteration and leaves it at another. Here it records
torch's CPU-side profile (the device's ops run on the host) and writes a Chrome trace,
``npu_sim_trace_<pid>.json``, into that folder: the hook's glue runs, with no NPU timeline.

torch_npu 2.1.0.post8 to 2.14.0 ship no ``torch_npu.npu.profile`` (only ``torch_npu.profiler``),
so on a real NPU with them mmengine's hook fails with ``AttributeError`` as it is built; the
simulation keeps this older API for the hook and says so in a warning.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Optional

import torch


class profileConfig:  # noqa: N801  (torch_npu's name)
    """msprof's switches (torch_npu's fields and defaults): recorded; only the call stack is
    used."""

    def __init__(
        self,
        ACL_PROF_ACL_API: bool = True,  # noqa: N803  (torch_npu's argument names)
        ACL_PROF_TASK_TIME: bool = True,  # noqa: N803
        ACL_PROF_AICORE_METRICS: bool = True,  # noqa: N803
        ACL_PROF_AICPU: bool = True,  # noqa: N803
        ACL_PROF_L2CACHE: bool = False,  # noqa: N803
        ACL_PROF_HCCL_TRACE: bool = True,  # noqa: N803
        ACL_PROF_TRAINING_TRACE: bool = False,  # noqa: N803
        TORCH_CALL_STACK: bool = False,  # noqa: N803
        aiCoreMetricsType: int = 1,  # noqa: N803
    ) -> None:
        self.switches = {
            "ACL_PROF_ACL_API": ACL_PROF_ACL_API,
            "ACL_PROF_TASK_TIME": ACL_PROF_TASK_TIME,
            "ACL_PROF_AICORE_METRICS": ACL_PROF_AICORE_METRICS,
            "ACL_PROF_AICPU": ACL_PROF_AICPU,
            "ACL_PROF_L2CACHE": ACL_PROF_L2CACHE,
            "ACL_PROF_HCCL_TRACE": ACL_PROF_HCCL_TRACE,
            "ACL_PROF_TRAINING_TRACE": ACL_PROF_TRAINING_TRACE,
        }
        self.AiCoreMetricsConfig = aiCoreMetricsType
        self.TorchCallStack = TORCH_CALL_STACK


class profile:  # noqa: N801  (torch_npu's name)
    """``with torch_npu.npu.profile(path): ...`` records torch's profile into ``path``."""

    def __init__(
        self,
        profiler_result_path: str = "./",
        use_e2e_profiler: bool = False,
        config: Optional[profileConfig] = None,
    ) -> None:
        warnings.warn(
            "torch_npu.npu.profile is simulated: torch_npu 2.1 to 2.14 have none (AttributeError "
            "on a real NPU, where mmengine's NPUProfilerHook fails); use torch_npu.profiler there",
            stacklevel=2,
        )
        self.result_path = profiler_result_path
        self.use_e2e_profiler = use_e2e_profiler
        self.config = config or profileConfig()
        self.entered = False
        self.trace_path = ""
        self._profiler: Optional[torch.profiler.profile] = None
        try:
            os.makedirs(self.result_path, exist_ok=True)
        except OSError:
            # torch_npu's message (its spelling).
            raise ValueError(f"the path of '{self.result_path}' is invaild.") from None

    def __enter__(self) -> profile:
        if self.entered:
            raise RuntimeError("npu profiler traces are not reentrant")
        self.entered = True
        self._profiler = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU],
            with_stack=self.config.TorchCallStack,
        )
        self._profiler.__enter__()
        return self

    def __exit__(self, *exc: Any) -> bool:
        assert self._profiler is not None
        self._profiler.__exit__(*exc)
        self.trace_path = os.path.join(self.result_path, f"npu_sim_trace_{os.getpid()}.json")
        self._profiler.export_chrome_trace(self.trace_path)
        return False
