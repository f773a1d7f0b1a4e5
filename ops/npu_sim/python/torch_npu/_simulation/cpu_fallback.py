"""torch_npu's CPU fallbacks on the simulated NPU: which ops would round-trip through the host.

torch_npu runs an aten op it has no NPU kernel for through a PrivateUse1 fallback that copies
the op's npu inputs to the host, runs the CPU kernel and copies the results back (a
device-to-host synchronisation on a real NPU), and warns once per op:
``CAUTION: The operator 'aten::...' is not currently supported on the NPU backend and will
fall back to run on the CPU. This may have performance implications.`` The simulated device
runs every op on the CPU; it warns and counts for the ops outside ``npu_kernels.txt`` (the aten
ops torch_npu 2.13.0 registers NPU kernels for, written by ``dev/tools/torch_npu_kernels.py``).

The warning is a ``UserWarning``, as torch_npu's is (a C++ ``c10`` warning); filter it by its
text: ``warnings.filterwarnings("ignore", message="CAUTION: The operator")``. Ops that PyTorch
decomposes before the backend (CompositeImplicitAutograd) never reach it, here or on a real NPU.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import List

import torch

NPU_KERNELS = Path(__file__).with_name("npu_kernels.txt")


def npu_kernels() -> List[str]:
    """The aten ops (``aten::name.overload``) torch_npu has an NPU kernel for."""
    lines = NPU_KERNELS.read_text().splitlines()
    return [line for line in lines if line and not line.startswith("#")]


def register() -> None:
    """Pass the list to the loaded device, which checks each op against it from now on."""
    torch.ops.npu_sim.set_npu_kernels(npu_kernels())


def fallbacks() -> Counter:
    """Calls per op (``aten::name.overload``) that ran through torch_npu's CPU fallback since
    the process started or since ``reset_fallbacks()``: host round trips on a real NPU."""
    names, counts = torch.ops.npu_sim.cpu_fallbacks()
    return Counter(dict(zip(names, counts)))


def reset_fallbacks() -> None:
    """Zero the counts; each op's warning stays once per process, as torch_npu's."""
    torch.ops.npu_sim.reset_cpu_fallbacks()
