"""A stand-in for HCCL, the collective library behind ``torch.distributed``'s ``hccl`` backend.

mmengine initialises ``hccl`` on an NPU (``dist/utils.py``). Here the backend is a
``ProcessGroup`` written in Python (torch lets a registered backend's creator return one)
that runs each collective with gloo over the same rendezvous store, on host copies of the
device tensors, and writes the results back into them. Every collective completes before it
returns, so its ``Work`` is done at once. It proves that the run's collectives (DDP's
parameter broadcast and bucket all-reduce, mmengine's metric gathering, barriers) reach
the backend with device tensors and come back; it says nothing about HCCL itself.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import Any, List

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroupGloo

BACKEND = "hccl"


class _DoneWork(dist.distributed_c10d.Work):
    """A collective that completed when it was issued; its future holds the tensors."""

    def __init__(self, result: List[torch.Tensor]) -> None:
        super().__init__()
        self._future = torch.futures.Future()
        self._future.set_result(result)

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future


def _host(tensors: List[torch.Tensor]) -> List[torch.Tensor]:
    return [t.cpu() for t in tensors]


def _write_back(devices: List[torch.Tensor], hosts: List[torch.Tensor]) -> None:
    for device, host in zip(devices, hosts):
        if device.data_ptr() != host.data_ptr():
            device.copy_(host)


class HostCollectives(dist.ProcessGroup):
    """``hccl`` on the simulated NPU: gloo on host copies."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self._gloo = ProcessGroupGloo(dist.PrefixStore("npu_sim_hccl", store), rank, size, timeout)
        print(
            f"[npu_sim] hccl stand-in: gloo on host copies (rank {rank} of {size})",
            file=sys.stderr,
            flush=True,
        )

    def getBackendName(self) -> str:  # noqa: N802  (torch's name)
        return BACKEND

    def _get_backend_name(self) -> str:
        return BACKEND

    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> _DoneWork:
        hosts = _host(tensors)
        self._gloo.allreduce(hosts, opts or dist.AllreduceOptions()).wait()
        _write_back(tensors, hosts)
        return _DoneWork(tensors)

    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> _DoneWork:
        hosts = _host(tensors)
        self._gloo.broadcast(hosts, opts or dist.BroadcastOptions()).wait()
        _write_back(tensors, hosts)
        return _DoneWork(tensors)

    def allgather(
        self,
        outputs: List[List[torch.Tensor]],
        inputs: List[torch.Tensor],
        opts: Any = None,
    ) -> _DoneWork:
        host_outputs = [_host(group) for group in outputs]
        self._gloo.allgather(host_outputs, _host(inputs), opts or dist.AllgatherOptions()).wait()
        for group, hosts in zip(outputs, host_outputs):
            _write_back(group, hosts)
        return _DoneWork([t for group in outputs for t in group])

    def _allgather_base(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> _DoneWork:
        host = output.cpu()
        self._gloo._allgather_base(host, input.cpu(), opts or dist.AllgatherOptions()).wait()
        _write_back([output], [host])
        return _DoneWork([output])

    def barrier(self, opts: Any = None) -> _DoneWork:
        self._gloo.barrier(opts or dist.BarrierOptions()).wait()
        return _DoneWork([])


def _create(store: dist.Store, rank: int, size: int, timeout: timedelta) -> HostCollectives:
    return HostCollectives(store, rank, size, timeout)


def register() -> None:
    """Register ``hccl`` for the ``npu`` device, unless a backend of that name exists."""
    if not dist.is_available() or BACKEND.upper() in dist.Backend._plugins:
        return
    if BACKEND in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND, _create, devices=["npu"])
