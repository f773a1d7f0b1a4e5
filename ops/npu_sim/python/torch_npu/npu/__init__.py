"""``torch.npu`` of the simulated NPU: the part of torch_npu's device API that mmengine 0.10.7,
mmdet 3.3, mmcv 2.1, DrivingSDK's Python wrapper and npudet call (listed in
``ops/npu_sim/README.md``), each with the behaviour torch_npu documents.

Where the simulation cannot behave like the device it says so: streams and events keep order
because every op has finished when it returns; random numbers come from the CPU generator,
which the fallback's CPU kernels draw from; memory counters count this device's host blocks.
"""

from __future__ import annotations

import os
from collections import namedtuple
from contextlib import contextmanager
from typing import Any, Iterator, List, Optional, Union

import torch

from . import amp, config, utils  # noqa: F401  (torch.npu.amp, .config, .utils)

native_device = "npu"  # mmengine maps 'npu' to this name in BaseModel.to
DEVICE_NAME = "Simulated Ascend NPU (npudet: PrivateUse1 on host memory, CPU arithmetic)"
# The opt-in that put this stand-in on sys.path; the device answers only while it is set.
SIMULATED_NPU_ENV = "NPUDET_SIMULATED_NPU"
DeviceLike = Union[None, int, str, torch.device]
_compile_mode = {"jit_compile": False}

# torch_npu's fields; the core counts are an Ascend 910B3's (20 AI cores, 2 vector cores each),
# so launch planning that reads them has the figure of the target the compile checks use.
_DeviceProperties = namedtuple(
    "_DeviceProperties", "name total_memory cube_core_num vector_core_num"
)


def _index(device: DeviceLike) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "npu":
        raise ValueError(f"device: expected an npu device, got {device}")
    return current_device() if device.index is None else device.index


def is_available() -> bool:
    """True while ``NPUDET_SIMULATED_NPU=1``: the tests' fixture sets it around a test, and
    the device, which torch cannot unregister, is hidden again once it is unset."""
    return os.environ.get(SIMULATED_NPU_ENV) == "1"


def device_count() -> int:
    """Devices of the simulation (``NPUDET_SIMULATED_NPU_COUNT``, default 8); 0 when hidden."""
    return int(torch.ops.npu_sim.device_count()) if is_available() else 0


def current_device() -> int:
    return int(torch.ops.npu_sim.current_device())


def set_device(device: DeviceLike) -> None:
    torch.ops.npu_sim.set_device(_index(device))


class device:
    """Context manager that makes ``device`` current inside the block."""

    def __init__(self, device: DeviceLike) -> None:
        self.idx = -1 if device is None else _index(device)
        self.prev = -1

    def __enter__(self) -> None:
        self.prev = current_device()
        if self.idx >= 0:
            set_device(self.idx)

    def __exit__(self, *exc: Any) -> None:
        set_device(self.prev)


def device_of(obj: torch.Tensor) -> device:
    return device(obj.get_device() if obj.device.type == "npu" else None)


def synchronize(device: DeviceLike = None) -> None:
    """Every op has completed when it returns: nothing to wait for."""


def is_initialized() -> bool:
    return True


def init() -> None:
    """torch_npu initialises the device here; the simulation is ready at import."""


def _lazy_init() -> None:
    """As ``init``."""


def _is_in_bad_fork() -> bool:
    return False


def get_device_name(device: DeviceLike = None) -> str:
    _index(device)
    return DEVICE_NAME


def get_device_properties(device: DeviceLike = None) -> _DeviceProperties:
    _index(device)
    return _DeviceProperties(DEVICE_NAME, mem_get_info()[1], 20, 40)


def get_amp_supported_dtype() -> List[torch.dtype]:
    """What ``torch.autocast('npu', dtype=...)`` accepts (torch asks the device module)."""
    return [torch.float16, torch.bfloat16]


def is_bf16_supported() -> bool:
    return True


def set_compile_mode(jit_compile: bool = False) -> None:
    """Recorded only: the simulation has no operator compiler (``get_compile_mode`` reads it)."""
    _compile_mode["jit_compile"] = bool(jit_compile)


def get_compile_mode() -> bool:
    return _compile_mode["jit_compile"]


# ---- memory: counters of this device's host blocks ----


def memory_allocated(device: DeviceLike = None) -> int:
    return int(torch.ops.npu_sim.memory_stats(_index(device))[0])


def max_memory_allocated(device: DeviceLike = None) -> int:
    return int(torch.ops.npu_sim.memory_stats(_index(device))[1])


def memory_reserved(device: DeviceLike = None) -> int:
    """No caching allocator: reserved is what is allocated."""
    return memory_allocated(device)


def max_memory_reserved(device: DeviceLike = None) -> int:
    return max_memory_allocated(device)


def reset_peak_memory_stats(device: DeviceLike = None) -> None:
    torch.ops.npu_sim.reset_peak_memory_stats(_index(device))


reset_max_memory_allocated = reset_peak_memory_stats


def memory_stats(device: DeviceLike = None) -> dict:
    allocated, peak, count = torch.ops.npu_sim.memory_stats(_index(device))
    return {
        "allocated_bytes.all.current": int(allocated),
        "allocated_bytes.all.peak": int(peak),
        "allocation.all.allocated": int(count),
    }


def empty_cache() -> None:
    """No caching allocator: blocks go back to the host at once."""


def mem_get_info(device: DeviceLike = None) -> tuple:
    """(free, total) bytes of host memory, which backs the device."""
    pages = os.sysconf("SC_PHYS_PAGES")
    free_pages = os.sysconf("SC_AVPHYS_PAGES")
    size = os.sysconf("SC_PAGE_SIZE")
    return free_pages * size, pages * size


# ---- random numbers: the CPU generator draws them ----


def manual_seed(seed: int) -> None:
    torch.random.default_generator.manual_seed(int(seed))


manual_seed_all = manual_seed


def seed() -> None:
    torch.random.default_generator.seed()


seed_all = seed


def initial_seed() -> int:
    return torch.random.default_generator.initial_seed()


def get_rng_state(device: DeviceLike = "npu") -> torch.Tensor:
    return torch.random.default_generator.get_state()


def set_rng_state(new_state: torch.Tensor, device: DeviceLike = "npu") -> None:
    torch.random.default_generator.set_state(new_state)


def get_rng_state_all() -> List[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states: List[torch.Tensor]) -> None:
    for state in new_states[:1]:
        set_rng_state(state)


# ---- streams and events: one in-order stream per device ----


class Stream(torch.Stream):
    """The device's one stream: work on it has completed when the call returns."""

    def __new__(cls, device: DeviceLike = None, priority: int = 0, **kwargs: Any) -> Stream:
        return super().__new__(cls, device=torch.device("npu", _index(device)), priority=priority)

    def wait_stream(self, stream: torch.Stream) -> None:
        """Nothing to wait for."""


class Event(torch.Event):
    def __new__(cls, enable_timing: bool = False, blocking: bool = False, **kwargs: Any) -> Event:
        return super().__new__(cls, device="npu", enable_timing=enable_timing, blocking=blocking)


def current_stream(device: DeviceLike = None) -> Stream:
    return Stream(device)


default_stream = current_stream


def set_stream(stream: torch.Stream) -> None:
    """One stream per device: nothing to switch."""


@contextmanager
def stream(stream: Optional[torch.Stream]) -> Iterator[None]:
    yield


# ---- legacy typed tensors (mmengine's InstanceData names torch.npu.BoolTensor / LongTensor) ----


class _TypedTensorMeta(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, torch.Tensor) and obj.device.type == "npu" and obj.dtype == cls.dtype


def _typed_tensor(name: str, dtype: torch.dtype) -> type:
    return _TypedTensorMeta(name, (), {"dtype": dtype, "is_npu": True})


BoolTensor = _typed_tensor("BoolTensor", torch.bool)
LongTensor = _typed_tensor("LongTensor", torch.int64)
IntTensor = _typed_tensor("IntTensor", torch.int32)
FloatTensor = _typed_tensor("FloatTensor", torch.float32)
HalfTensor = _typed_tensor("HalfTensor", torch.float16)
BFloat16Tensor = _typed_tensor("BFloat16Tensor", torch.bfloat16)
