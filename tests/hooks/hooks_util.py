"""A tiny mmengine model that calls the MSDA op, and a Runner to train it on random data."""

from __future__ import annotations

import uuid
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch import nn
from torch.utils.data import Dataset

from npudet.ops import multi_scale_deformable_attn

SHAPES = ((4, 4), (2, 2))
KEYS = sum(h * w for h, w in SHAPES)
CHANNELS, HEADS, POINTS, QUERIES = 8, 2, 2, 6


class ToyAttention(nn.Module):
    """Deformable attention of ``QUERIES`` queries over a 2-level map: (bs, q, C) -> same."""

    def __init__(self, impl: str = "auto") -> None:
        super().__init__()
        levels = len(SHAPES)
        self.impl = impl
        self.value_proj = nn.Linear(CHANNELS, CHANNELS)
        self.offsets = nn.Linear(CHANNELS, HEADS * levels * POINTS * 2)
        self.weights = nn.Linear(CHANNELS, HEADS * levels * POINTS)
        self.out_proj = nn.Linear(CHANNELS, CHANNELS)
        self.register_buffer("spatial_shapes", torch.tensor(SHAPES, dtype=torch.long))
        starts = [0] + [h * w for h, w in SHAPES][:-1]
        self.register_buffer("level_start", torch.tensor(starts).cumsum(0))
        self.register_buffer(
            "ref", torch.rand(QUERIES, 2, generator=torch.Generator().manual_seed(0))
        )

    def forward(self, query: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        bs, levels = query.shape[0], len(SHAPES)
        value = self.value_proj(feats).view(bs, KEYS, HEADS, CHANNELS // HEADS)
        offsets = self.offsets(query).view(bs, QUERIES, HEADS, levels, POINTS, 2)
        locations = self.ref[None, :, None, None, None] + 0.1 * offsets
        weights = self.weights(query).view(bs, QUERIES, HEADS, levels * POINTS).softmax(-1)
        weights = weights.view(bs, QUERIES, HEADS, levels, POINTS)
        out = multi_scale_deformable_attn(
            value, self.spatial_shapes, self.level_start, locations, weights, impl=self.impl
        )
        return query + self.out_proj(out)


class ToyModel(BaseModel):
    """Two ``ToyAttention`` layers regressing a target; ``forward(query, feats, target)``."""

    def __init__(self, impl: str = "auto") -> None:
        super().__init__()
        self.layers = nn.ModuleList(ToyAttention(impl) for _ in range(2))

    def forward(
        self,
        query: torch.Tensor,
        feats: torch.Tensor,
        target: torch.Tensor,
        mode: str = "loss",
    ) -> Any:
        for layer in self.layers:
            query = layer(query, feats)
        if mode == "loss":
            return {"loss_mse": F.mse_loss(query, target)}
        return query


class RandomSet(Dataset):
    """``length`` random samples; the targets of the indices in ``nan_at`` are NaN."""

    def __init__(self, length: int = 16, nan_at: Sequence[int] = ()) -> None:
        gen = torch.Generator().manual_seed(1)
        self.items: List[Dict[str, torch.Tensor]] = []
        for index in range(length):
            target = torch.randn(QUERIES, CHANNELS, generator=gen)
            if index in nan_at:
                target[0, 0] = float("nan")
            self.items.append(
                {
                    "query": torch.randn(QUERIES, CHANNELS, generator=gen),
                    "feats": torch.randn(KEYS, CHANNELS, generator=gen),
                    "target": target,
                }
            )

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Dict[str, torch.Tensor]:
        return self.items[index]


def toy_runner(
    work_dir: str,
    custom_hooks: List[dict],
    max_iters: int = 4,
    impl: str = "auto",
    nan_at: Sequence[int] = (),
    checkpoint_interval: Optional[int] = None,
    checkpoint_options: Optional[Dict[str, Any]] = None,
    batch_size: int = 2,
    clip_grad: Optional[dict] = None,
    lr: float = 0.05,
    log_level: str = "WARNING",
    model: Optional[BaseModel] = None,
    **runner_kwargs: Any,
) -> Runner:
    """An iteration-based Runner (SGD at ``lr``, log every iteration, local vis backend) on ToyModel
    (or ``model``); ``checkpoint_options`` update the checkpoint hook's settings (e.g. its
    ``type``, ``max_keep_ckpts``); ``runner_kwargs`` (e.g. ``resume``, ``load_from``) go to
    the Runner."""
    torch.manual_seed(0)
    default_hooks: Dict[str, Any] = {"logger": {"type": "LoggerHook", "interval": 1}}
    default_hooks["checkpoint"] = (
        {
            "type": "CheckpointHook",
            "interval": checkpoint_interval,
            "by_epoch": False,
            **(checkpoint_options or {}),
        }
        if checkpoint_interval
        else None
    )
    return Runner(
        model=model if model is not None else ToyModel(impl),
        work_dir=work_dir,
        experiment_name=f"toy_{uuid.uuid4().hex[:8]}",
        train_dataloader={
            "dataset": RandomSet(max_iters * batch_size, nan_at),
            "sampler": {"type": "DefaultSampler", "shuffle": False},
            "collate_fn": {"type": "default_collate"},
            "batch_size": batch_size,
            "num_workers": 0,
        },
        train_cfg={"by_epoch": False, "max_iters": max_iters},
        optim_wrapper={"optimizer": {"type": "SGD", "lr": lr}, "clip_grad": clip_grad},
        default_hooks=default_hooks,
        custom_hooks=custom_hooks,
        visualizer={"type": "Visualizer", "vis_backends": [{"type": "LocalVisBackend"}]},
        default_scope="mmdet",
        env_cfg={"cudnn_benchmark": False},
        log_level=log_level,
        **runner_kwargs,
    )
