"""``MSDASwitchHook``: a model no npudet class knows, its mmcv MSDA layers converted from
``custom_hooks`` before the first iteration, the optimizer (built first) still training them."""

from __future__ import annotations

import logging

import pytest
import torch
from mmcv.ops import MultiScaleDeformableAttention as MMCVMSDA
from mmengine.logging import MMLogger
from mmengine.model import BaseModel
from mmengine.runner import Runner
from msda_models_util import layer_impls, record_msda, running_on
from torch import nn

from npudet.models import MSDASwitchHook
from npudet.ops import msda_impls

pytestmark = pytest.mark.skipif("cpu" not in msda_impls(), reason="cpu kernel did not build")

DIMS = 16
SHAPES = torch.tensor([[4, 4], [2, 2]])
STARTS = torch.tensor([0, 16])


class ToyEncoder(nn.Module):
    """Two mmcv MSDA layers over a two-level map, as a user's model would build them."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            MMCVMSDA(DIMS, num_heads=2, num_levels=2, num_points=2, batch_first=True)
            for _ in range(2)
        )

    def forward(self, value: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
        query = value
        for layer in self.layers:
            query = layer(
                query,
                value=value,
                reference_points=points,
                spatial_shapes=SHAPES,
                level_start_index=STARTS,
            )
        return query


class ToyModel(BaseModel):
    """A model of the user's own: ``encoder`` holds its MSDA layers, ``head`` none."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(3, DIMS)
        self.encoder = ToyEncoder()
        self.head = nn.Linear(DIMS, 1)

    def forward(self, inputs: torch.Tensor, mode: str = "tensor"):
        value = self.embed(inputs)
        points = torch.rand(value.shape[0], value.shape[1], 2, 2, generator=_points(value))
        out = self.head(self.encoder(value, points.clamp(0.1, 0.9)))
        if mode == "loss":
            return dict(loss=out.square().mean())
        return out


def _points(value: torch.Tensor) -> torch.Generator:
    return torch.Generator().manual_seed(value.shape[0])


class ToyData(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> dict:
        return dict(inputs=torch.rand(20, 3, generator=torch.Generator().manual_seed(index)))


def runner(tmp_path, model: nn.Module, **hook) -> Runner:
    return Runner(
        model=model,
        work_dir=str(tmp_path),
        train_dataloader=dict(
            dataset=ToyData(),
            sampler=dict(type="DefaultSampler", shuffle=False),
            batch_size=2,
            collate_fn=dict(type="default_collate"),
        ),
        train_cfg=dict(by_epoch=False, max_iters=2),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.5)),
        default_hooks=dict(checkpoint=None),
        custom_hooks=[dict(type="MSDASwitchHook", **hook)],
        experiment_name=f"msda_hook_{tmp_path.name}",
    )


def test_converts_a_model_no_npudet_class_knows_and_trains_it(tmp_path) -> None:
    torch.manual_seed(0)
    model = ToyModel()
    params = {name: p for name, p in model.named_parameters()}
    before = {name: p.detach().clone() for name, p in params.items()}
    keys = list(model.state_dict())
    run = runner(tmp_path, model, impl="cpu")
    assert set(layer_impls(model).values()) == {"mmcv"}
    with record_msda(model) as record:
        run.train()  # builds the optimizer over the stock layers, then calls before_run
    optimized = {id(p) for group in run.optim_wrapper.param_groups for p in group["params"]}
    assert layer_impls(model) == {f"encoder.layers.{i}": "cpu" for i in range(2)}
    assert record.mmcv == 0 and dict(record.npudet) == {"cpu": 4}  # 2 layers x 2 iterations
    assert {name: p for name, p in model.named_parameters()} == params  # the same objects
    assert optimized == {id(p) for p in params.values()}
    assert list(model.state_dict()) == keys
    moved = [n for n in params if n.startswith("encoder.") and not params[n].equal(before[n])]
    assert moved, "the optimizer did not update the converted layers' parameters"
    log = (tmp_path / run.timestamp / f"{run.timestamp}.log").read_text()
    assert "MSDASwitchHook: converted 2 mmcv MSDA layers of ToyModel; MSDA implementation " \
           "per model part: encoder: cpu (2 layers)" in log  # fmt: skip


def test_same_output_as_stock_and_unwraps_ddp(tmp_path) -> None:
    """Inside DistributedDataParallel (gloo, one rank) the wrapped model is converted; its
    output is the stock model's."""
    import torch.distributed as dist

    torch.manual_seed(0)
    model = ToyModel().eval()  # mmcv's layer has dropout
    inputs = torch.rand(2, 20, 3)
    with torch.no_grad():
        stock = model(inputs)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
    try:
        wrapped = nn.parallel.DistributedDataParallel(model)
        fake = type("FakeRunner", (), {"model": wrapped, "logger": MMLogger.get_instance("hook")})
        MSDASwitchHook(impl="grid_sample").before_run(fake)
        with running_on(model, "grid_sample"), torch.no_grad():
            out = wrapped(inputs)
    finally:
        dist.destroy_process_group()
    torch.testing.assert_close(out, stock, atol=1e-5, rtol=1e-5)


def test_part_override_for_a_part_the_model_lacks_is_refused(caplog) -> None:
    fake = type("FakeRunner", (), {"model": ToyModel(), "logger": logging.getLogger("t")})
    with pytest.raises(ValueError, match=r"^MSDASwitchHook\.decoder: ToyModel has no "
                       r"deformable-attention layer under a module named 'decoder'; its MSDA "
                       r"parts: encoder \(encoder\)$"):  # fmt: skip
        MSDASwitchHook(impl="cpu", decoder="gather").before_run(fake)
    with pytest.raises(ValueError, match=r"^MSDASwitchHook\.impl: "):
        MSDASwitchHook(impl="fastest").before_run(fake)


def test_paths_choose_per_module_path() -> None:
    """``paths``: a module path prefix names the layers under it; the longest prefix wins over
    the part and ``impl``; ``encoder.layers.1`` is not a prefix of ``encoder.layers.10``."""
    model = ToyModel()
    fake = type("FakeRunner", (), {"model": model, "logger": logging.getLogger("t")})
    paths = {"encoder": "gather", "encoder.layers.1": "grid_sample"}
    MSDASwitchHook(impl="cpu", encoder="cpu", paths=paths).before_run(fake)
    assert layer_impls(model) == {"encoder.layers.0": "gather", "encoder.layers.1": "grid_sample"}
    with pytest.raises(ValueError, match=r"^MSDASwitchHook\.paths: ToyModel has no "
                       r"deformable-attention layer under 'encoder\.layers\.10'; its MSDA "
                       r"layers: encoder\.layers\.0, encoder\.layers\.1$"):  # fmt: skip
        MSDASwitchHook(paths={"encoder.layers.10": "cpu"}).before_run(fake)
    with pytest.raises(ValueError, match=r"^MSDASwitchHook\.paths\.head: "):
        MSDASwitchHook(paths={"head": "fastest"}).before_run(fake)
