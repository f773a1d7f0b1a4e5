"""What a device sees of a training iteration: ops dispatched and device-to-host syncs, by source.

:class:`DispatchCounter` is a ``TorchDispatchMode``: it sees every op below autograd (what a
device backend is handed: ``linear`` arrives as ``t`` + ``addmm``), and counts those with a
tensor of ``device_type`` among their inputs or outputs; a view (``OpOverload.is_view``:
``view``, ``permute``, ``expand``, ``detach`` ...) is counted and also reported apart, since
it changes metadata only and launches nothing on an NPU. A *host sync* is an op whose result
the host must wait for (:data:`SYNC_OPS`, :func:`sync_kind`): a read of a device value
(``item``), a copy to the host (``copy_to_host``: ``.cpu()``, ``.tolist()``, ``.numpy()``
after a copy), and an op whose output shape depends on the data (``data_dependent_shape``,
``bool_index``), which the host must know before it allocates.

Each counted op is attributed to a *source* (:data:`SOURCES`) by the first frame of
interest on the Python stack at dispatch time, innermost first (:data:`SOURCE_RULES`).
Backward ops run in autograd's engine, with no model frame on the stack: they are
attributed to the forward op that made their node, through the forward stack that autograd's
anomaly mode keeps on every node (the counter switches it on, NaN checks off); the engine's
own gradient sums, which belong to no node, are ``autograd``.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves

# Where an op comes from, in the order of the table's columns.
SOURCES = (
    "layers",  # npudet's layers and op (stock: mmcv's MSDA layer)
    "backbone_neck",
    "transformer_heads",  # the transformer and heads (mmdet), npudet's detector plumbing
    "matcher",  # mmdet's assigners and match costs (mmdet/models/task_modules)
    "losses",  # mmdet's losses and the heads' target / loss bookkeeping
    "loop",  # mmengine's runner, hooks, data preprocessing, parse_losses
    "optimizer",  # mmengine's OptimWrapper, torch.optim, gradient clipping
    "autograd",  # the engine's gradient sums (no forward op of their own)
    "other",
)
# (path fragment, source): a frame whose file contains the fragment belongs to the source;
# the first rule that a frame matches decides, and the innermost frame that matches any rule
# decides the op. "bench": the benchmark's own hooks, left out of every count; "": a frame of
# no source (mmengine's decorators and data structures serve their caller), looked past.
SOURCE_RULES: Tuple[Tuple[str, str], ...] = (
    ("/npudet/ablation/", "bench"),
    ("/npudet_dev/", "bench"),
    ("/mmengine/utils/", ""),
    ("/mmengine/structures/", ""),
    ("/mmengine/dist/", ""),
    ("/npudet/nn/", "layers"),
    ("/npudet/ops/", "layers"),
    ("/npudet/models/layers/", "layers"),
    ("/mx_driving/", "layers"),  # DrivingSDK's wrapper, called by npudet's npu_vendor route
    ("/mmcv/ops/multi_scale_deform_attn.py", "layers"),
    ("/mmdet/models/task_modules/", "matcher"),
    ("/npudet/models/heads/", "matcher"),  # the batched matching's prefetch
    ("/mmdet/models/losses/", "losses"),
    ("/mmdet/models/backbones/", "backbone_neck"),
    ("/mmdet/models/necks/", "backbone_neck"),
    ("/mmdet/models/data_preprocessors/", "loop"),
    ("/mmengine/optim/", "optimizer"),
    ("/torch/optim/", "optimizer"),
    ("/torch/nn/utils/clip_grad.py", "optimizer"),
    ("/mmengine/", "loop"),
    ("/mmdet/models/", "transformer_heads"),
    ("/npudet/models/", "transformer_heads"),
)
# Head methods (mmdet/models/dense_heads) whose own ops are target and loss bookkeeping.
LOSS_FUNCTIONS = frozenset(
    {
        "loss_by_feat",
        "loss_by_feat_single",
        "get_targets",
        "_get_targets_single",
        "loss_dn",
        "_loss_dn_single",
        "get_dn_targets",
        "_get_dn_targets_single",
    }
)
# Ops the host waits on whatever their inputs: a value read, or a data-dependent output size.
SYNC_OPS = {
    "_local_scalar_dense": "item",  # .item(), int() / float() / bool() of a tensor, a 0-d size
    "equal": "item",  # returns a Python bool
    "is_nonzero": "item",
    "nonzero": "data_dependent_shape",
    "masked_select": "data_dependent_shape",
    "_unique": "data_dependent_shape",
    "_unique2": "data_dependent_shape",
    "unique_dim": "data_dependent_shape",
    "unique_consecutive": "data_dependent_shape",
    "unique_dim_consecutive": "data_dependent_shape",
    "bincount": "data_dependent_shape",
}
# Indexing with a boolean mask: the kernel turns the mask into indices (a nonzero) first.
BOOL_INDEX_OPS = frozenset({"index", "index_put", "index_put_", "_index_put_impl_"})
# The engine boundary: frames outside it belong to whoever called backward(), not the op.
_AUTOGRAD_ENGINE = ("/torch/autograd/graph.py", "/torch/autograd/__init__.py")
_TRACE_LINE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_PACKAGES = ("mmdet", "mmcv", "mmengine", "npudet", "npudet_dev", "torch", "mx_driving")

Frame = Tuple[str, int, str]  # file, line, function


def classify_frame(filename: str, function: str) -> Optional[str]:
    """The source a frame belongs to (:data:`SOURCE_RULES`), or None."""
    path = filename.replace("\\", "/")
    for fragment, source in SOURCE_RULES:
        if fragment in path:
            if source == "transformer_heads" and function in LOSS_FUNCTIONS:
                return "losses"
            return source or None
    return None


def short_path(filename: str) -> str:
    """``.../site-packages/mmdet/models/x.py`` -> ``mmdet/models/x.py`` (no machine paths)."""
    path = filename.replace("\\", "/")
    cut = max(path.rfind(f"/{pkg}/") for pkg in _PACKAGES)
    return path[cut + 1 :] if cut >= 0 else path.rsplit("/", 1)[-1]


def attribute(frames: Iterable[Frame]) -> Tuple[str, str]:
    """(source, site) of the innermost frame that a rule claims; frames innermost first.
    ``site``: ``path:line function`` of that frame."""
    for filename, line, function in frames:
        source = classify_frame(filename, function)
        if source is not None:
            return source, f"{short_path(filename)}:{line} {function}"
    return "other", "?"


def sync_kind(func: Any, args: tuple, out: Any, device_type: str) -> Optional[str]:
    """Why the host waits on this op (a :data:`SYNC_OPS` kind, ``bool_index``,
    ``copy_to_host``), or None; called for ops that touch ``device_type``."""
    name = func.overloadpacket.__name__
    if name in SYNC_OPS:
        return SYNC_OPS[name]
    if name == "repeat_interleave" and func._overloadname.startswith("Tensor"):
        return "data_dependent_shape"
    if name in BOOL_INDEX_OPS:
        indices = args[1] if len(args) > 1 else ()
        if any(
            isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
            for i in indices or ()
        ):
            return "bool_index"
    if name == "_to_copy" and isinstance(out, torch.Tensor):
        src = args[0]
        if src.device.type == device_type and out.device.type == "cpu":
            return "copy_to_host"
    if name == "copy_" and len(args) > 1:
        dst, src = args[0], args[1]
        if dst.device.type == "cpu" and src.device.type == device_type:
            return "copy_to_host"
    return None


def _host_to_device(func: Any, args: tuple, out: Any, device_type: str) -> bool:
    name = func.overloadpacket.__name__
    if name == "_to_copy" and isinstance(out, torch.Tensor):
        return args[0].device.type == "cpu" and out.device.type == device_type
    if name == "copy_" and len(args) > 1 and isinstance(args[1], torch.Tensor):
        return args[0].device.type == device_type and args[1].device.type == "cpu"
    return False


class Tally:
    """One iteration's counts (see :meth:`as_dict`)."""

    def __init__(self) -> None:
        self.ops: Counter = Counter()  # by source
        self.views: Counter = Counter()
        self.syncs: Counter = Counter()
        self.backward_ops = 0
        self.host_to_device = 0
        self.sync_kinds: Counter = Counter()
        self.op_names: Counter = Counter()
        self.op_sites: Counter = Counter()  # (source, site)
        self.sync_sites: Counter = Counter()  # (source, site, kind, op)
        self.bench = Counter()  # ops / syncs of the benchmark's own hooks, not counted

    def as_dict(self, top: int = 15) -> Dict[str, Any]:
        """Totals (``ops``, ``views``, ``syncs``, ``backward_ops``, ``host_to_device``),
        ``by_source`` {source: {ops, views, syncs}}, ``sync_kinds``, ``ops_by_name``, the
        ``top_op_sites``, every sync site (``sync_sites``: [source, site, kind, op, count])
        and ``bench``."""
        return {
            "ops": sum(self.ops.values()),
            "views": sum(self.views.values()),
            "syncs": sum(self.syncs.values()),
            "backward_ops": self.backward_ops,
            "host_to_device": self.host_to_device,
            "by_source": {
                s: {"ops": self.ops[s], "views": self.views[s], "syncs": self.syncs[s]}
                for s in SOURCES
            },
            "sync_kinds": dict(self.sync_kinds),
            "ops_by_name": dict(self.op_names.most_common()),
            "top_op_sites": [[*k, n] for k, n in self.op_sites.most_common(top)],
            "sync_sites": [[*k, n] for k, n in self.sync_sites.most_common()],
            "bench": dict(self.bench),
        }


class DispatchCounter(TorchDispatchMode):
    """Counts the ops that touch ``device_type`` into :attr:`tally` while active (module
    docstring). Enter it around what is counted; :meth:`opaque` makes a Python function count
    as one op (a vendor kernel's double)."""

    def __init__(self, device_type: str = "npu") -> None:
        super().__init__()
        self.device_type = device_type
        self.tally = Tally()
        self._node_sources: Dict[int, Tuple[Any, Tuple[str, str]]] = {}
        self._anomaly: Optional[torch.autograd.set_detect_anomaly] = None
        self._active = False

    def __enter__(self) -> DispatchCounter:
        self.tally = Tally()
        self._node_sources.clear()
        self._anomaly = torch.autograd.set_detect_anomaly(True, check_nan=False)
        self._anomaly.__enter__()
        self._active = True
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        self._active = False
        self._anomaly.__exit__(*exc)
        self._node_sources.clear()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        touches = any(
            isinstance(t, torch.Tensor) and t.device.type == self.device_type
            for t in tree_leaves((args, kwargs, out))
        )
        if touches:
            kind = sync_kind(func, args, out, self.device_type)
            self._count(func.overloadpacket.__name__, func.is_view, kind)
            if _host_to_device(func, args, out, self.device_type):
                self.tally.host_to_device += 1
        return out

    def _count(self, name: str, is_view: bool, kind: Optional[str]) -> None:
        node = torch._C._current_autograd_node()
        source, site = self._where(node)
        tally = self.tally
        if source == "bench":
            tally.bench["ops"] += 1
            tally.bench["syncs"] += kind is not None
            return
        tally.ops[source] += 1
        tally.views[source] += is_view
        tally.backward_ops += node is not None
        tally.op_names[name] += 1
        tally.op_sites[(source, site)] += 1
        if kind is not None:
            tally.syncs[source] += 1
            tally.sync_kinds[kind] += 1
            tally.sync_sites[(source, site, kind, name)] += 1

    def _where(self, node: Any) -> Tuple[str, str]:
        """(source, site) of the op now dispatched: the Python stack up to autograd's engine,
        then (in a backward) the forward stack of the node being run."""
        frame = sys._getframe(3)
        while frame is not None:
            code = frame.f_code
            if node is not None and code.co_filename.replace("\\", "/").endswith(_AUTOGRAD_ENGINE):
                break
            source = classify_frame(code.co_filename, code.co_name)
            if source is not None:
                return source, f"{short_path(code.co_filename)}:{frame.f_lineno} {code.co_name}"
            frame = frame.f_back
        if node is None:
            return "other", "?"
        return self._node_source(node)

    def _node_source(self, node: Any) -> Tuple[str, str]:
        meta = node.metadata
        cached = self._node_sources.get(id(meta))
        if cached is not None:
            return cached[1]
        trace = meta.get("traceback_") or []
        frames: List[Frame] = []
        for entry in reversed(trace):
            match = _TRACE_LINE.search(entry)
            if match:
                frames.append((match.group(1), int(match.group(2)), match.group(3)))
        where = attribute(frames) if frames else ("autograd", type(node).__name__)
        self._node_sources[id(meta)] = (meta, where)  # keeps meta alive: its id stays unique
        return where

    def opaque(self, fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        """``fn`` counted as one op ``name`` on the device (never a sync), its own ops not
        seen: what a vendor kernel's Python double computes is one launch on the device."""

        def one_op(*args: Any, **kwargs: Any) -> Any:
            if self._active:
                self._count(name, False, None)
            with _disable_current_modes():
                return fn(*args, **kwargs)

        return one_op
