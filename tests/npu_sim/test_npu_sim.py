"""The simulated NPU (ops/npu_sim): the device, the torch_npu stand-in, the DrivingSDK double,
and npudet's op on ``npu`` through every implementation that claims it.

Rung 4 of the ladder for Ascend: glue and contracts, not NPU speed or numerics.
"""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import textwrap

import pytest
import torch
from npu_sim_util import REPO, SIM_PATH, npu_env

from npudet.ops.msda import auto, validate_inputs
from npudet.ops.msda.verification import parity

PY = sys.executable


def _child(code: str, **env: str) -> str:
    """Run ``code`` in a new interpreter with the simulation requested; its stdout."""
    done = subprocess.run(
        [PY, "-c", textwrap.dedent(code)],
        env=npu_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_variable_brings_the_stand_in_before_anything_else():
    """With only the variable set: torch loads the stand-in, mmengine sees an NPU, npudet lists
    npu_vendor; without it, torch_npu does not import."""
    out = _child(
        """
        import json, torch
        facts = {"torch.npu": torch.npu.is_available(), "cann": torch.version.cann}
        import torch_npu, mx_driving
        from mmengine.device import get_device, is_npu_support_full_precision
        from mmengine.registry import OPTIMIZERS
        from mmengine.optim.optimizer.builder import NPU_OPTIMIZERS
        from npudet.ops import msda_impls
        facts.update(torch_npu=torch_npu.__file__, mx_driving=mx_driving.__file__,
                     device=get_device(), full_precision=is_npu_support_full_precision(),
                     impls=msda_impls(), name=torch.npu.get_device_name(0),
                     optimizers=[n for n in NPU_OPTIMIZERS if OPTIMIZERS.get(n)])
        print(json.dumps(facts))
        """
    )
    facts = json.loads(out.strip().splitlines()[-1])
    assert facts["torch.npu"] is True and facts["cann"] == "simulated"
    assert facts["torch_npu"].startswith(str(SIM_PATH))
    assert facts["mx_driving"].startswith(str(SIM_PATH))
    assert facts["device"] == "npu" and facts["full_precision"] is True
    assert "npu_vendor" in facts["impls"]
    assert sorted(facts["optimizers"]) == ["NpuFusedAdam", "NpuFusedAdamW", "NpuFusedSGD"]
    assert "Simulated" in facts["name"]
    plain = subprocess.run(
        [PY, "-c", "import torch_npu"],
        env={k: v for k, v in npu_env().items() if k != "NPUDET_SIMULATED_NPU"},
        capture_output=True,
        text=True,
    )
    assert plain.returncode != 0 and "No module named 'torch_npu'" in plain.stderr


def test_torch_npu_imported_before_torch():
    """``import torch_npu`` first loads the device as torch_npu does (its own ``import torch``
    runs with the backend autoload off, so torch does not import the half-made package again),
    and leaves the autoload switch as it found it, for child processes."""
    out = _child(
        """
        import torch_npu, os, torch
        print(torch.npu.is_available(), torch.ones(1, device="npu").device,
              os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"])
        """
    )
    assert out.split() == ["True", "npu:0", "1"]


def test_refuses_to_shadow_a_real_torch_npu(tmp_path):
    real = tmp_path / "torch_npu"
    real.mkdir()
    (real / "__init__.py").write_text("")
    done = subprocess.run(
        [PY, "-c", "import torch_npu"],
        env=npu_env(PYTHONPATH=str(tmp_path)),
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "a real torch_npu is installed" in done.stderr and str(real) in done.stderr


def test_device_glue(simulated_npu):
    """Copies, views, autograd, a second device, counters, checkpoints across devices."""
    x = torch.randn(4, 6)
    y = x.to("npu")
    assert y.device.type == "npu" and y.is_npu
    assert torch.equal(((y * 2).relu().t()[1:3]).cpu(), (x * 2).relu().t()[1:3])
    leaf = torch.randn(5, 5, device="npu:1", requires_grad=True)
    (leaf.t().contiguous().view(25) ** 2).sum().backward()
    assert leaf.grad.device == torch.device("npu", 1)
    torch.testing.assert_close(leaf.grad.cpu(), 2 * leaf.detach().cpu())
    before = torch.npu.memory_allocated(0)
    block = torch.empty(1 << 20, device="npu:0")
    assert torch.npu.memory_allocated(0) - before == 4 << 20
    assert torch.npu.max_memory_allocated(0) >= torch.npu.memory_allocated(0)
    del block
    assert torch.npu.memory_allocated(0) == before
    buffer = io.BytesIO()
    torch.save({"w": y}, buffer)
    buffer.seek(0)
    assert torch.load(buffer)["w"].device.type == "npu"
    buffer.seek(0)
    assert torch.equal(torch.load(buffer, map_location="cpu")["w"], x)
    conv = torch.nn.Conv2d(3, 4, 3).npu()
    images = torch.randn(2, 3, 8, 8)
    with torch.autocast("npu", dtype=torch.float16):
        assert conv(images.npu()).dtype == torch.float16
    torch.testing.assert_close(conv(images.npu()).cpu(), conv.cpu()(images))
    assert isinstance(torch.zeros(2, dtype=torch.bool, device="npu"), torch.npu.BoolTensor)
    assert not isinstance(torch.zeros(2, dtype=torch.bool), torch.npu.BoolTensor)


@pytest.mark.parametrize("impl", ["npu_vendor", "grid_sample", "gather", "gather_det", "triton"])
def test_op_parity_on_simulated_npu(simulated_npu, impl):
    """Every parity case, forward and the three gradients, against the float64 CPU reference:
    within CPU's tolerances, or declined by the implementation's own limits. ``triton`` runs
    its Ascend schedule under the Triton interpreter, which reads the device's host memory."""
    # Under the interpreter a Triton case takes seconds: the probe case only (every case runs
    # on CPU tensors in test_msda_triton.py / test_triton_ascend.py).
    cases = [parity.PROBE_CASE] if impl == "triton" else None
    result = parity.check_parity(impl, "npu", torch.float32, cases)
    assert result.correct, result.error or result.declined
    outcomes = {case.case: case.status for case in result.cases}
    assert set(outcomes.values()) <= {parity.PASSED, parity.DECLINED}, result.cases
    assert outcomes[parity.PROBE_CASE] == parity.PASSED


def test_auto_in_deterministic_mode_on_simulated_npu(simulated_npu):
    """Under torch.use_deterministic_algorithms(True) ``auto`` takes ``gather_det`` for npu
    tensors (every faster candidate's backward adds atomically), and two runs agree bitwise."""
    inputs = parity.small_inputs(**parity.PARITY_CASES[parity.PROBE_CASE])
    out_shape = (inputs[3].shape[0], inputs[3].shape[1], inputs[0].shape[2] * inputs[0].shape[3])
    grad = parity.cotangent(out_shape)
    tensors = [t.npu().requires_grad_(t.is_floating_point()) for t in inputs]
    torch.use_deterministic_algorithms(True)
    try:
        chosen = auto.select_impl("auto", validate_inputs(*tensors)).NAME
        first, second = (parity.vjp(chosen, inputs, grad, "npu") for _ in range(2))
    finally:
        torch.use_deterministic_algorithms(False)
    assert chosen == "gather_det"
    for name, a, b in zip(parity.TENSORS, first, second):
        assert a.device.type == "npu" and torch.equal(a, b), name


def test_npu_vendor_on_npu_matches_grid_sample_on_cpu(simulated_npu):
    inputs = parity.small_inputs(**parity.PARITY_CASES[parity.PROBE_CASE])
    out_shape = (inputs[3].shape[0], inputs[3].shape[1], inputs[0].shape[2] * inputs[0].shape[3])
    grad = parity.cotangent(out_shape)
    want = parity.vjp("grid_sample", inputs, grad, "cpu")
    got = parity.vjp("npu_vendor", inputs, grad, "npu")
    assert all(t.device.type == "npu" for t in got)
    for name, g, w in zip(parity.TENSORS, got, want):
        assert parity.errors(g, w)[1] <= parity.TOLERANCE[torch.float32], name


def _msda_args(heads=4, dim=32, levels=2, points=4):
    shapes = torch.tensor([[6, 4], [3, 2]][:levels] + [[2, 2]] * max(0, levels - 2))
    starts = torch.cat([shapes.new_zeros(1), (shapes[:, 0] * shapes[:, 1]).cumsum(0)[:-1]])
    keys = int((shapes[:, 0] * shapes[:, 1]).sum())
    value = torch.randn(1, keys, heads, dim)
    loc = torch.rand(1, 5, heads, levels, points, 2)
    weights = torch.rand(1, 5, heads, levels, points)
    return [t.npu() for t in (value, shapes.int(), starts.int(), loc, weights)]


@pytest.mark.parametrize(
    "breach, message",
    [
        (dict(dim=264), "The number of embedding dimensions should be less than or equal to 256"),
        (
            dict(levels=9, points=8),
            "The product of the number of levels and the number of points should be less than "
            "or equal to 64",
        ),
        (dict(heads=16), "num_heads 16 > 8"),
        (dict(dim=36), "embed 36 is not a multiple of 8"),
    ],
)
def test_mx_driving_double_refuses_contract_breaches(simulated_npu, breach, message):
    import mx_driving

    with pytest.raises(RuntimeError, match=message):
        mx_driving.multi_scale_deformable_attn(*_msda_args(**breach))


def test_mx_driving_double_binding_checks(simulated_npu):
    """The binding's own messages (the wrapper casts, so these are reached through _C)."""
    from mx_driving import _C

    value, shapes, starts, loc, weights = _msda_args()
    with pytest.raises(
        RuntimeError,
        match="value_spatial_shapes: int32 tensor expected but got a tensor with dtype: Long",
    ):
        _C.multi_scale_deformable_attn(value, shapes.long(), starts, loc, weights)
    with pytest.raises(RuntimeError, match="value is torch.float16; the op info declares float32"):
        _C.multi_scale_deformable_attn(value.half(), shapes, starts, loc, weights)
    with pytest.raises(RuntimeError, match="must be an NPU tensor, got cpu"):
        _C.multi_scale_deformable_attn(value.cpu(), shapes, starts, loc, weights)
    with pytest.raises(RuntimeError, match="must be contiguous"):
        _C.multi_scale_deformable_attn(value, shapes, starts, loc.transpose(3, 4), weights)
    with pytest.raises(Exception, match="Input Tensor can not be a empty Tensor"):
        import mx_driving

        mx_driving.multi_scale_deformable_attn(value[:, :0], shapes, starts, loc, weights)


def test_auto_on_npu_walks_the_npu_list_verifies_and_records(simulated_npu, tmp_path, monkeypatch):
    from npudet.ops import multi_scale_deformable_attn
    from npudet.ops.msda import auto
    from npudet.ops.msda.verification import records

    monkeypatch.setenv("NPUDET_VERIFY_FILE", str(tmp_path / "verified.json"))
    auto.reset()
    monkeypatch.setattr(auto, "_announced", set())
    value, shapes, starts, loc, weights = _msda_args()
    # A handler on the npudet logger itself, enabled at INFO: an earlier test's logging setup
    # may have disabled it or stopped it propagating to the root logger caplog listens on.
    logged = []
    handler = logging.Handler(logging.INFO)
    handler.emit = logged.append
    logger = logging.getLogger("npudet")
    monkeypatch.setattr(logger, "disabled", False)
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        out = multi_scale_deformable_attn(value, shapes.long(), starts.long(), loc, weights)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert out.device.type == "npu"
    assert auto.AUTO_PRIORITY["npu"][0] == "npu_vendor"
    chosen = [r.getMessage() for r in logged if "npudet MSDA auto on npu" in r.getMessage()]
    assert chosen and "'npu_vendor'" in chosen[0], [r.getMessage() for r in logged]
    assert auto.untrusted_reason("npu_vendor", "npu:0", torch.float32) == ""
    key = records.fingerprint("npu_vendor", "npu")
    assert key["toolkit"] == "simulated" and key["torch_npu"] == "0+npudet.simulated"
    auto.reset()


def test_compile_on_npu_names_why_inductor_cannot(simulated_npu):
    """Inductor has no code generator for the simulated device (torch_npu brings its own):
    one line before any work; aot_eager compiles."""
    from mmengine.config import Config

    from npudet.hooks.torch_compile import compile_with_hook

    with pytest.raises(ValueError, match="compile: inductor has no code generator for the npu"):
        compile_with_hook(Config(dict(compile=True)))
    cfg = Config(dict())
    assert compile_with_hook(cfg, "aot_eager")
    assert cfg.custom_hooks[-1] == dict(type="TorchCompileHook", backend="aot_eager")


def test_triton_on_npu_needs_triton_ascend_or_the_interpreter(simulated_npu, monkeypatch):
    from npudet.ops.msda.backends import triton as backend

    monkeypatch.setitem(sys.modules, backend._KERNELS, type("K", (), {"INTERPRETED": False}))
    reasons = backend._npu_reasons()
    assert reasons and "triton-ascend" in reasons[0]


def test_npu_vendor_is_declined_inside_torch_compile(simulated_npu):
    """Both vendor routes end in a pybind binding dynamo cannot trace: `auto` must take the next
    candidate in compiled code instead of breaking the graph there."""
    from unittest import mock

    from npudet.ops.msda import get_impl, validate_inputs

    info = validate_inputs(*_msda_args(), check_values=False)
    assert get_impl("npu_vendor").not_supported_reasons(info) == []
    with mock.patch("npudet.utils.torch_compat.torch_is_compiling", return_value=True):
        reasons = get_impl("npu_vendor").not_supported_reasons(info)
    assert reasons == ["mx_driving: its autograd.Function does not trace under torch.compile"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_amp_on_npu_takes_both_half_dtypes(dtype):
    from npudet.engine.amp import amp_optim_wrapper

    wrapper = amp_optim_wrapper(dict(type="OptimWrapper"), "npu", dtype)
    assert wrapper == dict(type="AmpOptimWrapper", dtype=dtype, loss_scale="dynamic")
