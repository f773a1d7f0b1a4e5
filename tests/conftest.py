"""Shared fixtures: a tiny generated shapes set."""

from __future__ import annotations

import os
import sys
from typing import List

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Without a GPU, Triton kernels run under its interpreter on CPU tensors. Set before any
# kernel is decorated (npudet.ops.msda.triton_kernels is imported on first use).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def data_options(root: str) -> List[str]:
    """``--cfg-options`` pointing the small configs at a shapes set under ``root``."""
    root = root.rstrip("/") + "/"
    ann = os.path.join(root, "annotations", "instances_val.json")
    return [
        f"train_dataloader.dataset.data_root={root}",
        f"val_dataloader.dataset.data_root={root}",
        f"test_dataloader.dataset.data_root={root}",
        f"val_evaluator.ann_file={ann}",
        f"test_evaluator.ann_file={ann}",
    ]


@pytest.fixture(scope="session")
def tiny_shapes(tmp_path_factory: pytest.TempPathFactory) -> str:
    from npudet.datasets import make_shapes_dataset

    root = str(tmp_path_factory.mktemp("shapes"))
    make_shapes_dataset(root, num_train=8, num_val=4, seed=3)
    return root
