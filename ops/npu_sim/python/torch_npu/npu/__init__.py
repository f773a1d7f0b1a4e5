"""``torch.npu`` of the simulated NPU: the part of torch_npu's device API that mmengine 0.10.7,
mmdet 3.3, mmcv 2.1, DrivingSDK's Python wrapper and npudet call (listed in
``ops/npu_sim/README.md``), each with the behaviour torch_npu documents.

Where the simulation cannot behave like the device it says so: streams keep order because
every op has finished when it returns, and events time the host's clock between records;
each device has its own generator (CPU's Mersenne Twister, not the NPU's Philox); memory
counters count this device's host blocks.
"""

from __future__ import annotations

import os
import time
from collections import namedtuple
from typing import Any, List, Optional, Union

import torch

from . import amp, config, utils  # noqa: F401  (torch.npu.amp, .config, .utils)
from .profiler import profile, profileConfig  # noqa: F401  (torch_npu.npu.profile)

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


# torch_npu's words when a forked child initialises the device.
_BAD_FORK = (
    "Cannot re-initialize NPU in forked subprocess. To use NPU with multiprocessing, you must "
    "use the 'spawn' start method"
)


def _is_in_bad_fork() -> bool:
    """True in a child forked after the device loaded (the native at-fork handler marks it);
    torch's seeding skips the device there, and every device op raises."""
    return bool(torch.ops.npu_sim.is_in_bad_fork())


def is_initialized() -> bool:
    return not _is_in_bad_fork()


def init() -> None:
    """torch_npu initialises the device here; the simulation is ready at import, except in a
    forked child, where it raises as torch_npu does."""
    if _is_in_bad_fork():
        raise RuntimeError(_BAD_FORK)


_lazy_init = init


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
    """Recorded only: the simulation has no operator compiler (``is_jit_compile_false`` reads
    it)."""
    _compile_mode["jit_compile"] = bool(jit_compile)


def is_jit_compile_false() -> bool:
    """torch_npu's reading of ``set_compile_mode``: True when binary kernels are chosen."""
    return not _compile_mode["jit_compile"]


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


def memory_summary(device: DeviceLike = None, abbreviated: bool = False) -> str:
    """A table of this device's counters, in the shape of torch_npu's (``abbreviated`` is
    accepted; the simulation has only the rows it counts)."""
    index = _index(device)
    allocated, peak, count = torch.ops.npu_sim.memory_stats(index)
    width = 75
    rows = [
        ("Allocated memory (current)", _bytes(allocated)),
        ("Allocated memory (peak)", _bytes(peak)),
        ("Allocations (total)", str(int(count))),
        ("Reserved memory (no caching allocator)", _bytes(allocated)),
    ]
    title = f" PyTorch NPU memory summary, device ID {index} (simulated NPU) "
    lines = [
        "|" + "=" * width + "|",
        "|" + title.center(width) + "|",
        "|" + "-" * width + "|",
    ]
    lines += ["|" + f" {name:<50}{value:>23} " + "|" for name, value in rows]
    lines.append("|" + "=" * width + "|")
    return "\n".join(lines) + "\n"


def _bytes(count: int) -> str:
    if abs(count) < 1024:
        return f"{count} B"
    value = count / 1024
    for unit in ("KiB", "MiB"):
        if abs(value) < 1024:
            return f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} GiB"


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


# ---- random numbers: one generator per device, apart from the CPU's (torch_npu's API) ----


def _generator(device: DeviceLike = None) -> torch.Generator:
    """The device's default generator: what npu draws without ``generator=`` advance."""
    return torch.ops.npu_sim.default_generator(_index(device))


def _all_devices() -> range:
    # Also while the fixture hides the device: torch.manual_seed seeds every generator.
    return range(int(torch.ops.npu_sim.device_count()))


def __getattr__(name: str) -> Any:
    # torch_npu.npu.default_generators; built on first use, after the native library loaded.
    if name == "default_generators":
        return tuple(_generator(i) for i in _all_devices())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def manual_seed(seed: int) -> None:
    """Seed the current device's generator."""
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seed every device's generator (``torch.manual_seed`` calls this)."""
    for index in _all_devices():
        _generator(index).manual_seed(int(seed))


def seed() -> None:
    """Seed the current device's generator with a random number."""
    _generator().seed()


def seed_all() -> None:
    """One random seed for every device's generator."""
    value = _generator(0).seed()
    for index in _all_devices():
        _generator(index).manual_seed(value)


def initial_seed() -> int:
    return _generator().initial_seed()


def get_rng_state(device: DeviceLike = "npu") -> torch.Tensor:
    return _generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: DeviceLike = "npu") -> None:
    _generator(device).set_state(new_state)


def get_rng_state_all() -> List[torch.Tensor]:
    return [get_rng_state(i) for i in _all_devices()]


def set_rng_state_all(new_states: List[torch.Tensor]) -> None:
    for index, state in enumerate(new_states):
        set_rng_state(state, index)


# ---- streams and events: streams run in order; events hold the host's clock ----


class Stream(torch.Stream):
    """An npu stream. Work on it has completed when the call returns, so waits are no-ops."""

    def __new__(cls, device: DeviceLike = None, priority: int = 0, **kwargs: Any) -> Stream:
        if "stream_id" in kwargs:  # wraps an existing stream (current_stream, default_stream)
            return super().__new__(cls, **kwargs)
        return super().__new__(cls, device=torch.device("npu", _index(device)), priority=priority)

    def record_event(self, event: Optional[torch.Event] = None) -> torch.Event:
        """Record ``event`` (a new ``Event`` if None) on this stream, and return it."""
        event = Event() if event is None else event
        event.record(self)
        return event


def _wrap(stream: torch.Stream) -> Stream:
    return Stream(
        stream_id=stream.stream_id,
        device_index=stream.device_index,
        device_type=stream.device_type,
    )


class Event(torch.Event):
    """An npu event. ``elapsed_time`` is the wall time between the two records (work before
    a record has completed when it is recorded).

    torch's ``Event.elapsed_time`` accepts only a ``torch.Event`` itself as the other event,
    not a subclass (``expected other to be a torch.Event object``), so this class keeps its
    record times here, as torch_npu's Python ``Event`` wraps its own native event.
    """

    def __new__(
        cls,
        enable_timing: bool = False,
        blocking: bool = False,
        interprocess: bool = False,
        **kwargs: Any,
    ) -> Event:
        event = super().__new__(
            cls,
            device="npu",
            enable_timing=enable_timing,
            blocking=blocking,
            interprocess=interprocess,
        )
        event._timing = enable_timing
        event._recorded_at = None  # time.perf_counter() at the last record
        return event

    def record(self, stream: Optional[torch.Stream] = None) -> None:
        super().record(stream)
        self._recorded_at = time.perf_counter()

    def elapsed_time(self, end_event: torch.Event) -> float:
        if not isinstance(end_event, Event):  # a plain torch.Event: the device's own clock
            return super().elapsed_time(end_event)
        # CUDA's and torch_npu's messages.
        if self._recorded_at is None or end_event._recorded_at is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        if not (self._timing and end_event._timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        return (end_event._recorded_at - self._recorded_at) * 1000.0


def current_stream(device: DeviceLike = None) -> Stream:
    return _wrap(torch.accelerator.current_stream(_index(device)))


def default_stream(device: DeviceLike = None) -> Stream:
    current = torch.accelerator.current_stream(_index(device))
    return Stream(stream_id=0, device_index=current.device_index, device_type=current.device_type)


def set_stream(stream: Optional[torch.Stream]) -> None:
    if stream is not None:
        torch.accelerator.set_stream(stream)


class StreamContext:
    """Make ``stream`` current inside the block (and its device), then restore both."""

    def __init__(self, stream: Optional[torch.Stream]) -> None:
        self.stream = stream
        self.prev_device = -1
        self.prev_stream: Optional[torch.Stream] = None

    def __enter__(self) -> None:
        if self.stream is None:
            return
        self.prev_device = current_device()
        self.prev_stream = torch.accelerator.current_stream(self.stream.device_index)
        torch.accelerator.set_stream(self.stream)

    def __exit__(self, *exc: Any) -> None:
        if self.stream is None or self.prev_stream is None:
            return
        torch.accelerator.set_stream(self.prev_stream)
        set_device(self.prev_device)


def stream(stream: Optional[torch.Stream]) -> StreamContext:
    return StreamContext(stream)


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
ByteTensor = _typed_tensor("ByteTensor", torch.uint8)
CharTensor = _typed_tensor("CharTensor", torch.int8)
ShortTensor = _typed_tensor("ShortTensor", torch.int16)
DoubleTensor = _typed_tensor("DoubleTensor", torch.float64)
