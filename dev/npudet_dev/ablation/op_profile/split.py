"""Where a profiled training iteration's time goes, by op: the MSDA layers' own work and the rest.

A torch.profiler trace (CPU activity) of iterations whose code ran inside named *scopes*:
``record_function`` ranges called ``npudet.scope::KIND`` (:mod:`.scopes` opens them around
modules and methods, and one around each iteration). Every event's self time (the profiler's
``self_cpu_time_total``: wall time on its thread not spent in child events) goes to one
:data:`CATEGORIES` entry and one phase (``forward``, ``backward``, ``other``):

- **forward**: the innermost scope the op ran in; in the MSDA layer's mixed scopes (its
  ``forward``, ``project_value``, ``deformable_attend``) the *top op* (the first op under the
  scope, which the Python code called) decides: softmax, a reshape (:data:`RESHAPE_OPS`), or
  the scope's own category. A scope's own self time is the Python between its ops.
- **backward**: each autograd node (``autograd::engine::evaluate_function: XBackward0``) is
  linked to the forward op that created it, through the node's sequence number (the forward
  op's ``sequence_nr`` on the thread the node names, ``fwd_thread``; of the forward ops that
  peeked the same number, the one that started last created the node), and takes that op's
  category; its child ops follow it. ``AccumulateGrad`` nodes (parameters' gradients) have no
  forward op.
- **other**: the optimizer's scope and what ran outside the model (hooks, loss parsing).

Only the iteration scope's thread is counted (the autograd engine runs CPU backward on the
calling thread); events of other threads in the window are reported beside, not in a category.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Tuple

SCOPE = "npudet.scope::"
NODE = "autograd::engine::evaluate_function: "
ACCUMULATE_GRAD = "torch::autograd::AccumulateGrad"
PHASES = ("forward", "backward", "other")


@dataclass(frozen=True)
class Category:
    """One row of the split: ``key``, its ``label`` and ``group`` (``msda``: the MSDA layers'
    own work; ``rest``: everything else)."""

    key: str
    label: str
    group: str


CATEGORIES = (
    Category("msda.value_proj", "value projection (+ padding mask)", "msda"),
    Category("msda.offsets_proj", "sampling-offset (+ fused attention-weight) projection", "msda"),
    Category("msda.weights_softmax", "attention-weight projection + softmax", "msda"),
    Category("msda.locations", "sampling locations (+ non-finite guard)", "msda"),
    Category("msda.op", "MSDA op", "msda"),
    Category("msda.output_proj", "output projection", "msda"),
    Category("msda.reshapes", "reshapes / permutes / copies", "msda"),
    Category("msda.residual", "query_pos add, dropout, residual", "msda"),
    Category("msda.host", "Python between the layer's ops", "msda"),
    Category("data", "data preprocessor", "rest"),
    Category("backbone_neck", "backbone + neck", "rest"),
    Category("pos_query", "position embeddings, query generation", "rest"),
    Category("ref_points", "reference points, encoder/decoder glue", "rest"),
    Category("ffn", "FFNs", "rest"),
    Category("norm", "layer norms", "rest"),
    Category("self_attn", "self-attention", "rest"),
    Category("heads", "heads (cls / reg branches)", "rest"),
    Category("loss_matcher", "losses + matcher", "rest"),
    Category("detector", "detector, other forward", "rest"),
    Category("grad_accumulation", "gradient accumulation (AccumulateGrad)", "rest"),
    Category("autograd_engine", "autograd engine outside nodes", "rest"),
    Category("optimizer", "optimizer (clip, step, zero_grad)", "rest"),
    Category("other", "outside any scope (hooks, loss parsing)", "rest"),
    Category("unlinked", "backward nodes not linked to a forward op", "rest"),
)
CATEGORY = {c.key: c for c in CATEGORIES}
# What is not attributed to a part of the model.
UNATTRIBUTED = ("other", "unlinked")
# The categories outside the iteration benchmark's "transformer rest" (time_split: data,
# backbone + neck, the op, the loss's forward, optimizer, other); the loss's backward is in it.
NOT_TRANSFORMER_REST = ("data", "backbone_neck", "msda.op", "optimizer", "other")

# Scope kinds whose ops all go to one category (the kind names what :mod:`.scopes` marks).
SCOPE_CATEGORY = {
    "iteration": "other",
    "detector": "detector",
    "data_preprocessor": "data",
    "backbone_neck": "backbone_neck",
    "pos_query": "pos_query",
    "ref_points": "ref_points",
    "ffn": "ffn",
    "norm": "norm",
    "self_attn": "self_attn",
    "heads": "heads",
    "loss_matcher": "loss_matcher",
    "backward": "autograd_engine",
    "optimizer": "optimizer",
    "msda.value_proj": "msda.value_proj",
    "msda.offsets_proj": "msda.offsets_proj",
    "msda.weights_proj": "msda.weights_softmax",
    "msda.op": "msda.op",
    "msda.output_proj": "msda.output_proj",
}
# The MSDA layer's mixed scopes: its forward, project_value, deformable_attend. Their top
# ops go by name (softmax, reshapes), else here; their own self time is the layer's Python.
MIXED_SCOPE_CATEGORY = {
    "msda.layer": "msda.residual",
    "msda.value": "msda.value_proj",
    "msda.attend": "msda.locations",
}
# The phase a scope's contents run in (others inherit their parent's).
SCOPE_PHASE = {
    "detector": "forward",
    "data_preprocessor": "forward",
    "backward": "backward",
    "optimizer": "other",
}
# Ops that only reshape, view or copy a tensor.
RESHAPE_OPS = frozenset(
    "aten::" + name
    for name in (
        "view view_as reshape _unsafe_view permute movedim transpose t flatten unflatten "
        "contiguous clone copy_ expand unsqueeze squeeze select slice narrow as_strided "
        "split unbind"
    ).split()
)


def mixed_category(scope: str, top_op: str) -> str:
    """The category of ``top_op`` called in the MSDA layer's mixed ``scope``."""
    if "softmax" in top_op:
        return "msda.weights_softmax"
    if top_op in RESHAPE_OPS:
        return "msda.reshapes"
    return MIXED_SCOPE_CATEGORY[scope]


def category_of(scope: str, top_op: Optional[str]) -> str:
    """The category of an op under ``scope`` (innermost) whose top op is ``top_op``, or of
    the scope's own self time (``top_op`` None)."""
    if scope in MIXED_SCOPE_CATEGORY:
        return "msda.host" if top_op is None else mixed_category(scope, top_op)
    return SCOPE_CATEGORY.get(scope, "other")


def _us(event: Any) -> float:
    return float(event.self_cpu_time_total)


@dataclass
class _Item:
    """One event's attribution: its phase, its category or (backward) the link to resolve."""

    event: Any
    phase: str
    category: Optional[str]
    link: Optional[Tuple[int, int]] = None  # (forward thread, sequence number) of its node
    node: Optional[str] = None  # the autograd node the event runs in (backward)


def _walk(root: Any) -> Tuple[List[_Item], Counter, Dict[str, Counter]]:
    """Every event under ``root`` (an iteration scope) with its phase and category (or link);
    the number of each scope kind entered; forward top-op calls per category."""
    items: List[_Item] = []
    scopes: Counter = Counter()
    calls: Dict[str, Counter] = defaultdict(Counter)
    # (event, scope, top op, phase, backward node, link)
    stack = [(root, "iteration", None, "other", None, None)]
    while stack:
        event, scope, top, phase, node, link = stack.pop()
        name = event.name
        if name.startswith(SCOPE):
            scope, top = name[len(SCOPE) :], None
            phase = SCOPE_PHASE.get(scope, phase)
            scopes[scope] += 1
            items.append(_Item(event, phase, category_of(scope, None)))
        elif name.startswith(NODE):
            node, phase = name[len(NODE) :], "backward"
            if node == ACCUMULATE_GRAD:
                link = None
                items.append(_Item(event, phase, "grad_accumulation", node=node))
            else:
                link = (event.fwd_thread, event.sequence_nr)
                items.append(_Item(event, phase, None, link, node))
        elif node is not None:  # an op run by an autograd node
            category = "grad_accumulation" if link is None else None
            items.append(_Item(event, phase, category, link, node))
        else:
            if top is None:
                top = name
                calls[category_of(scope, top)][top] += 1
            items.append(_Item(event, phase, category_of(scope, top)))
        for child in reversed(event.cpu_children):
            stack.append((child, scope, top, phase, node, link))
    return items, scopes, calls


class _Creators:
    """Which forward op created an autograd node, from the node's (thread, sequence number).

    Every op records the number the next node will take; creating a node takes it. So the
    creator of node N is, of the ops outside backward that recorded N, the one that started
    last. A node that no op recorded was created within the op that created the node before
    it (an in-place op on a view makes ``CopySlices`` and the view's regenerated
    ``AsStridedBackward0`` after its own node): the op with the largest recorded number
    below N.
    """

    def __init__(self, items: Iterable[_Item]) -> None:
        self.found: Dict[Tuple[int, int], _Item] = {}
        for item in items:
            seq = item.event.sequence_nr
            if item.phase == "backward" or seq < 0:
                continue
            key = (item.event.thread, seq)
            known = self.found.get(key)
            if known is None or item.event.time_range.start >= known.event.time_range.start:
                self.found[key] = item
        self.numbers: Dict[int, List[int]] = defaultdict(list)
        for thread, seq in sorted(self.found):
            self.numbers[thread].append(seq)

    def get(self, link: Optional[Tuple[int, int]]) -> Optional[_Item]:
        """The creator of node ``link`` = (forward thread, sequence number), None if unknown."""
        if link is None or link in self.found:
            return self.found.get(link)
        thread, seq = link
        numbers = self.numbers.get(thread, [])
        below = bisect.bisect_left(numbers, seq)
        return self.found[(thread, numbers[below - 1])] if below else None


def attribute_iteration(root: Any, events: Iterable[Any] = ()) -> Dict[str, Any]:
    """The split of one iteration scope ``root`` (a profiler event with its children) in ms:
    ``total_ms`` (the scope's duration), ``categories`` {key: {phase: ms}}, ``sum_ms``,
    ``unattributed_ms``, ``other_threads_ms`` (self time of ``events`` on other threads within
    the scope's window), ``scopes`` {kind: entries}, ``calls`` {category: {top op: forward
    calls}}, ``top_ops`` {category: {phase: {op: self ms}}} (an op run by an autograd node as
    ``node > op``, the node's own self time as ``node``), ``unlinked_nodes`` {node: ms}."""
    items, scopes, calls = _walk(root)
    creators = _Creators(items)
    split: Dict[str, Dict[str, float]] = {c.key: dict.fromkeys(PHASES, 0.0) for c in CATEGORIES}
    top_ops: Dict[str, Dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    unlinked: Counter = Counter()
    for item in items:
        category = item.category
        if category is None:
            creator = creators.get(item.link)
            category = creator.category if creator is not None else "unlinked"
            if creator is None:
                unlinked[item.node] += _us(item.event)
        split[category][item.phase] += _us(item.event)
        name = item.event.name
        if not name.startswith(SCOPE):
            if name.startswith(NODE):
                name = item.node
            elif item.node is not None and name != item.node:
                name = f"{item.node} > {name}"
            top_ops[category][item.phase][name] += _us(item.event)
    window = (root.time_range.start, root.time_range.end)
    others = sum(
        _us(e)
        for e in events
        if e.thread != root.thread and window[0] <= e.time_range.start < window[1]
    )
    categories = {k: {p: v / 1e3 for p, v in phases.items()} for k, phases in split.items()}
    total_sum = sum(sum(phases.values()) for phases in categories.values())
    return {
        "total_ms": (window[1] - window[0]) / 1e3,
        "sum_ms": total_sum,
        "unattributed_ms": sum(sum(categories[k].values()) for k in UNATTRIBUTED),
        "other_threads_ms": others / 1e3,
        "categories": categories,
        "scopes": dict(scopes),
        "calls": {k: dict(v.most_common()) for k, v in calls.items()},
        "top_ops": {
            k: {p: {op: v / 1e3 for op, v in c.most_common()} for p, c in phases.items()}
            for k, phases in top_ops.items()
        },
        "unlinked_nodes": {k: v / 1e3 for k, v in unlinked.most_common()},
    }


def attribute(events: List[Any]) -> List[Dict[str, Any]]:
    """:func:`attribute_iteration` of every iteration scope in a profiler's ``events()``."""
    roots = [e for e in events if e.name == SCOPE + "iteration"]
    return [attribute_iteration(root, events) for root in roots]


def _mean(values: List[Any], n: int) -> Any:
    """The sum of ``values`` over ``n``: numbers, or dicts key by key (a missing key is 0)."""
    if isinstance(values[0], dict):
        keys = dict.fromkeys(k for v in values for k in v)
        return {k: _mean([v[k] for v in values if k in v], n) for k in keys}
    return sum(values) / n


def mean_split(splits: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The mean over iterations of :func:`attribute_iteration`'s splits (times, counts and
    top ops alike), with ``iterations``: how many."""
    return {**_mean(splits, len(splits)), "iterations": len(splits)}


def totals(split: Dict[str, Any]) -> Dict[str, Dict[str, float]]:
    """Per category ``{phase: ms, "total": ms, "share": fraction of the iteration}``, and per
    group (``group:msda``, ``group:rest``) the same summed."""
    out: Dict[str, Dict[str, float]] = {}
    groups: Dict[str, Dict[str, float]] = {}
    for c in CATEGORIES:
        phases = split["categories"][c.key]
        row = {**phases, "total": sum(phases.values())}
        row["share"] = row["total"] / split["total_ms"] if split["total_ms"] else 0.0
        out[c.key] = row
        group = groups.setdefault(
            f"group:{c.group}", dict.fromkeys((*PHASES, "total", "share"), 0.0)
        )
        for k, v in row.items():
            group[k] += v
    return {**out, **groups}


def transformer_rest(split: Dict[str, Any]) -> Dict[str, float]:
    """The iteration benchmark's ``transformer_rest`` in the split's terms (ms): ``total``,
    ``msda_layers`` (the MSDA layers' own work but the op) and ``others`` (the rest of it)."""
    cat = split["categories"]
    parts = {
        c.key: sum(cat[c.key].values()) for c in CATEGORIES if c.key not in NOT_TRANSFORMER_REST
    }
    parts["loss_matcher"] -= cat["loss_matcher"]["forward"]
    layers = sum(v for k, v in parts.items() if CATEGORY[k].group == "msda")
    total = sum(parts.values())
    return {"total": total, "msda_layers": layers, "others": total - layers}
