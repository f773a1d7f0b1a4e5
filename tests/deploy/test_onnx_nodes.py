"""MSDA as one fused ONNX node per call (``npudet.deploy.onnx_nodes``) and the ONNX Runtime
library that runs it (``npudet.deploy.ort_library``, ``ops/onnxruntime/``).

A module of two ``npudet.nn.MSDeformAttn`` layers over two feature maps (level shapes from
the maps' sizes) is exported once per flavour with the batch, the query count and every map
size dynamic. The mmdeploy and npu graphs are checked against their parsers' contracts (they
do not run here: no TensorRT, no CANN); the npudet and mmdeploy graphs, and the GridSample
one, run in ONNX Runtime at two sizes other than the export size, against eager PyTorch.

The library's first build (with the header fetch) took about 3 minutes on the shared 2-core
machine; the exports take 5-10 s each; later runs load the cached build.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch.export import Dim

from npudet.deploy import onnx_nodes, ort_custom_ops, ort_headers
from npudet.nn import MSDeformAttn
from npudet.ops.msda import level_start_index, multi_scale_deformable_attn
from npudet.ops.msda.kernels import native_build

EMBED, HEADS, LEVELS, POINTS = 16, 2, 2, 2
INPUTS = ["query", "map0", "map1", "reference_points"]
# (batch, [(h, w) per level], queries): the export size, then two others.
EXPORT_SIZE = (2, [(6, 5), (3, 4)], 7)
RUN_SIZES = [(1, [(9, 4), (5, 2)], 3), (2, [(4, 11), (2, 6)], 12)]


class TwoLayers(torch.nn.Module):
    """Two MSDA layers in a row on value flattened from two maps: two MSDA calls."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        make = lambda: MSDeformAttn(EMBED, HEADS, LEVELS, POINTS, 0.0, batch_first=True)  # noqa: E731
        self.layers = torch.nn.ModuleList([make(), make()])

    def forward(self, query, map0, map1, reference_points):
        maps = (map0, map1)
        value = torch.cat([m.flatten(2).transpose(1, 2) for m in maps], 1)
        pairs = [(m.shape[2], m.shape[3]) for m in maps]
        for layer in self.layers:
            query = layer(
                query, value=value, reference_points=reference_points, spatial_shapes=pairs
            )
        return query


def _inputs(batch: int, sizes: List[Tuple[int, int]], queries: int, seed: int) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    maps = [torch.randn(batch, EMBED, h, w, generator=gen) for h, w in sizes]
    query = torch.randn(batch, queries, EMBED, generator=gen)
    ref = torch.rand(batch, queries, LEVELS, 2, generator=gen) * 1.2 - 0.1
    return (query, *maps, ref)


def _dynamic_shapes() -> tuple:
    batch, queries = Dim("batch", min=1, max=64), Dim("queries", min=1, max=4096)
    maps = [
        {0: batch, 2: Dim(f"h{i}", min=2, max=256), 3: Dim(f"w{i}", min=2, max=256)}
        for i in range(LEVELS)
    ]
    return ({0: batch, 1: queries}, *maps, {0: batch, 1: queries})


@pytest.fixture(scope="module")
def model() -> TwoLayers:
    return TwoLayers().eval()


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory) -> Dict[str, Path]:
    """Flavour -> its ONNX file, exported on first use."""
    folder, files = tmp_path_factory.mktemp("onnx"), {}

    def get(flavour: str) -> Path:
        if flavour not in files:
            files[flavour] = onnx_nodes.export_with_msda_node(
                model,
                _inputs(*EXPORT_SIZE, seed=0),
                folder / f"{flavour}.onnx",
                msda_node=flavour,
                dynamic_shapes=_dynamic_shapes(),
                input_names=INPUTS,
            )
        return files[flavour]

    return get


@pytest.fixture(scope="module")
def library() -> Path:
    # No skip: without a compiler or ONNX Runtime's headers (offline: set NPUDET_ORT_HEADERS)
    # the fused graph cannot run, and these tests fail saying why.
    missing = native_build.compiler_missing()
    assert not missing, missing
    return ort_custom_ops.ort_library()


def _session(path: Path, library: Optional[Path] = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    if library is not None:
        options.register_custom_ops_library(str(library))
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _types(model_proto) -> Dict[str, onnx.TypeProto]:
    """Every value's inferred type by name (inputs, outputs, intermediates)."""
    inferred = onnx.shape_inference.infer_shapes(model_proto)
    graph = inferred.graph
    return {v.name: v.type for v in [*graph.input, *graph.value_info, *graph.output]}


def test_bad_flavour_is_a_clear_error(model) -> None:
    with pytest.raises(ValueError, match=r"msda_node: expected one of \['npudet'"):
        with onnx_nodes.msda_onnx_node("tensorrt"):
            pass
    with pytest.raises(ValueError, match="msda_node: .* got 3"):
        onnx_nodes.export_with_msda_node(model, _inputs(*EXPORT_SIZE, 0), "unused.onnx", 3)


def test_eager_calls_are_not_redirected(model) -> None:
    args = _inputs(*RUN_SIZES[0], seed=1)
    want = model(*args)
    with onnx_nodes.msda_onnx_node("npudet"):
        got = model(*args)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("flavour", sorted(onnx_nodes.FLAVOURS))
def test_fused_graph_contract(exported, flavour: str) -> None:
    """One node per MSDA call in the flavour's domain / name / version, mmcv's five inputs
    with the level inputs in the flavour's integer type, a typed (batch, queries, 16)
    output, no GridSample left; the checker's full check passes."""
    spec = onnx_nodes.FLAVOURS[flavour]
    proto = onnx.load(str(exported(flavour)))
    onnx.checker.check_model(proto, full_check=True)
    imports = {o.domain: o.version for o in proto.opset_import}
    assert imports[spec.domain] == spec.version
    nodes = [n for n in proto.graph.node if n.domain == spec.domain]
    assert [n.op_type for n in nodes] == [spec.op_type] * 2
    assert not [n for n in proto.graph.node if n.op_type == "GridSample"]
    types = _types(proto)
    index_type = {torch.int64: onnx.TensorProto.INT64, torch.int32: onnx.TensorProto.INT32}
    for node in nodes:
        assert len(node.input) == 5 and len(node.output) == 1
        elem = [types[name].tensor_type.elem_type for name in node.input]
        floats = onnx.TensorProto.FLOAT
        assert elem == [floats, *[index_type[spec.index_dtype]] * 2, floats, floats]
        shapes = [len(types[name].tensor_type.shape.dim) for name in node.input]
        assert shapes == [4, 2, 1, 6, 5]
        out = types[node.output[0]].tensor_type
        assert out.elem_type == floats
        dims = [d.dim_param or d.dim_value for d in out.shape.dim]
        assert dims[0] == "batch" and dims[2] == HEADS * (EMBED // HEADS)
        assert isinstance(dims[1], str)  # the query count stays symbolic
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs == spec.attributes


def test_gridsample_graph_has_no_fused_node(exported) -> None:
    proto = onnx.load(str(exported("gridsample")))
    onnx.checker.check_model(proto, full_check=True)
    assert {o.domain for o in proto.opset_import} <= {"", "ai.onnx"}
    assert [n.op_type for n in proto.graph.node].count("GridSample") == 2 * LEVELS


@pytest.mark.parametrize("flavour", ["npudet", "mmdeploy", "gridsample"])
def test_graph_runs_in_onnxruntime_at_other_sizes(exported, library, model, flavour) -> None:
    session = _session(exported(flavour), library)
    for seed, size in enumerate(RUN_SIZES, start=1):
        args = _inputs(*size, seed=seed)
        (got,) = session.run(None, {n: a.numpy() for n, a in zip(INPUTS, args)})
        want = model(*args)
        assert got.shape == (size[0], size[2], EMBED)
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-5, atol=1e-5)


def test_plain_onnxruntime_refuses_the_fused_node(exported) -> None:
    with pytest.raises(Exception, match="MultiScaleDeformableAttn"):
        _session(exported("npudet"))


def _single_node(domain: str, op_type: str, index_type: int) -> onnx.ModelProto:
    """A graph of one fused node whose five inputs are the graph's."""
    helper, tp = onnx.helper, onnx.TensorProto
    ins = [
        helper.make_tensor_value_info("value", tp.FLOAT, ["B", "K", HEADS, 4]),
        helper.make_tensor_value_info("shapes", index_type, [LEVELS, 2]),
        helper.make_tensor_value_info("starts", index_type, [LEVELS]),
        helper.make_tensor_value_info("loc", tp.FLOAT, ["B", "Q", HEADS, LEVELS, POINTS, 2]),
        helper.make_tensor_value_info("attn", tp.FLOAT, ["B", "Q", HEADS, LEVELS, POINTS]),
    ]
    out = helper.make_tensor_value_info("out", tp.FLOAT, ["B", "Q", HEADS * 4])
    node = helper.make_node(op_type, [i.name for i in ins], ["out"], domain=domain)
    graph = helper.make_graph([node], "msda", ins, [out])
    imports = [helper.make_opsetid("", 18), helper.make_opsetid(domain, 1)]
    return helper.make_model(graph, opset_imports=imports)


@pytest.mark.parametrize(
    "flavour, dtype", [("npudet", np.int64), ("mmdeploy", np.int32), ("npudet", np.int32)]
)
def test_library_takes_int32_or_int64_levels_and_reports_kernel_errors(
    library, tmp_path, flavour, dtype
) -> None:
    spec = onnx_nodes.FLAVOURS[flavour]
    index_type = onnx.TensorProto.INT64 if dtype == np.int64 else onnx.TensorProto.INT32
    path = tmp_path / "one.onnx"
    onnx.save(_single_node(spec.domain, spec.op_type, index_type), str(path))
    session = _session(path, library)
    gen = torch.Generator().manual_seed(3)
    shapes = torch.tensor([[3, 5], [2, 2]])
    value = torch.randn(2, 19, HEADS, 4, generator=gen)
    loc = torch.rand(2, 6, HEADS, LEVELS, POINTS, 2, generator=gen)
    attn = torch.rand(2, 6, HEADS, LEVELS, POINTS, generator=gen)
    starts = level_start_index(shapes)
    feed = {
        "value": value.numpy(),
        "shapes": shapes.numpy().astype(dtype),
        "starts": starts.numpy().astype(dtype),
        "loc": loc.numpy(),
        "attn": attn.numpy(),
    }
    (got,) = session.run(None, feed)
    want = multi_scale_deformable_attn(value, shapes, starts, loc, attn, impl="grid_sample")
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)
    feed["starts"] = np.array([0, 14], dtype=dtype)  # not the cumulative H*W
    with pytest.raises(Exception, match="npudet MSDA: level_start_index"):
        session.run(None, feed)


def test_build_key_follows_sources_and_headers(tmp_path) -> None:
    """The build folder's key changes with either source, the kernel's header and ORT's C
    API header, and only then."""
    copies = []
    for rel in [*ort_custom_ops.SOURCES, "msda_cpu/msda_cpu.h"]:
        target = tmp_path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(native_build.native_path(rel), target)
        copies.append(target)
    headers = tmp_path / "ort"
    headers.mkdir()
    (headers / "onnxruntime_c_api.h").write_text("#define ORT_API_VERSION 21\n")
    sources = [tmp_path / rel for rel in ort_custom_ops.SOURCES]
    march = "-march=x86-64-v2"

    def key() -> Path:
        return ort_custom_ops.build_dir(sources, headers, march)

    first = key()
    assert key() == first
    seen = {first}
    for edited in [*copies, headers / "onnxruntime_c_api.h"]:
        edited.write_text(edited.read_text() + "\n// edited\n")
        assert key() not in seen, edited.name
        seen.add(key())


def test_headers_errors_name_the_variable_and_the_url(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(ort_headers.ENV, str(tmp_path))
    with pytest.raises(RuntimeError, match=f"{ort_headers.ENV}=.*onnxruntime_cxx_api.h"):
        ort_headers.headers_dir()
    url = "http://127.0.0.1:9/libonnxruntime-dev.deb"  # the discard port: refused at once
    with pytest.raises(RuntimeError, match=f"fetching .* from {url} failed"):
        ort_headers._download(url, timeout=5)


def test_unpacks_headers_from_a_deb(tmp_path) -> None:
    """A ``.deb`` built here (``ar`` around ``data.tar.xz``) gives up its ORT headers."""
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w:xz") as tar:
        for name, text in [
            ("./usr/include/onnxruntime/onnxruntime_cxx_api.h", b"// cxx\n"),
            ("./usr/include/onnxruntime/core/x.h", b"// x\n"),
            ("./usr/lib/libother.so", b"\0"),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text))
    members = [(b"debian-binary", b"2.0\n"), (b"data.tar.xz", tar_bytes.getvalue())]
    deb = b"!<arch>\n"
    for name, data in members:
        header = name.ljust(16) + b"0".ljust(12) + b"0".ljust(6) * 2 + b"100644".ljust(8)
        deb += header + str(len(data)).encode().ljust(10) + b"`\n" + data + b"\n" * (len(data) % 2)
    out = ort_headers.unpack_headers(deb, tmp_path / "include")
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.h")) == [
        "core/x.h",
        "onnxruntime_cxx_api.h",
    ]
    with pytest.raises(ValueError, match="not an ar archive"):
        ort_headers.unpack_headers(b"PK\x03\x04", tmp_path / "bad")
    assert os.listdir(tmp_path) == ["include"]
