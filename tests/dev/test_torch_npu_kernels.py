"""``dev/tools/torch_npu_kernels.py`` reads torch_npu's kernel table from a wheel, and the list
the simulated NPU ships was written by it (its provenance line has the tool's format)."""

from __future__ import annotations

import runpy
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

# Tests of the project's own machinery (dev/).
pytestmark = pytest.mark.dev

ROOT = Path(__file__).resolve().parents[2]


def _tool() -> SimpleNamespace:
    return SimpleNamespace(**runpy.run_path(str(ROOT / "dev/tools/torch_npu_kernels.py")))


def test_the_shipped_list_has_the_tools_provenance_line():
    tool = _tool()
    first, *ops = tool.OUT.read_text().splitlines()
    assert tool.PROVENANCE.match(first), first
    assert ops == sorted(ops) and all(op.startswith("aten::") for op in ops)
    assert "aten::add.Tensor" in ops and "aten::_embedding_bag_backward" not in ops


def test_a_wheels_table_gives_its_aten_ops_without_the_custom_ones(tmp_path):
    tool = _tool()
    table = {
        "supported": ["add.Tensor", {"func": "gather", "impl_ns": "op_api"}],
        "symint": [
            "as_strided_",
            {"func": "npu_gather_backward(Tensor grad) -> Tensor"},
        ],
        "custom": [{"func": "npu_gather_backward(Tensor grad) -> Tensor"}],
    }
    wheel = tmp_path / "torch_npu-9.9.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(tool.TABLE, yaml.safe_dump(table))
        archive.writestr("torch_npu-9.9.0.dist-info/METADATA", "Name: torch_npu\nVersion: 9.9.0\n")
    out = tmp_path / "list.txt"
    assert tool.write(wheel, out) == 3
    first, *ops = out.read_text().splitlines()
    assert first == tool.provenance("9.9.0", wheel.name) and tool.PROVENANCE.match(first)
    assert ops == ["aten::add.Tensor", "aten::as_strided_", "aten::gather"]
