"""``auto`` verifies before it trusts, orders by measurement, and reads nothing per call.

No GPU here: calls on CUDA are ``MSDAInputs`` descriptions and records in a temporary
``NPUDET_VERIFY_FILE``; checks that run, run on CPU tensors. The no-sync proof runs the op
on ``meta`` tensors (a device without host memory) under a dispatch mode that counts every
read back to the host.
"""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
import weakref

import pytest
import torch
from msda_util import DYNAMO_2_1, random_inputs
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from npudet.ops import multi_scale_deformable_attn
from npudet.ops.msda import (
    MSDAImpl,
    MSDAInputs,
    auto,
    auto_order,
    get_impl,
    msda_impls,
    msda_variants,
    registry,
    select_impl,
    validate_inputs,
)
from npudet.ops.msda.backends import mmcv as mmcv_impl
from npudet.ops.msda.backends.gather import msda_gather
from npudet.ops.msda.verification import parity, records
from npudet.ops.msda.verification.records import Record

aten = torch.ops.aten
VARIANTS = ["cpu_atomic", "cpu_corner", "cpu_headmajor", "cpu_noprefetch", "cpu_owner"]


def cuda_call(dtype=torch.float32, batch=2) -> MSDAInputs:
    """A Deformable-DETR-encoder-like call on a GPU (a description: nothing runs)."""
    return MSDAInputs("cuda", dtype, batch, 13294, 8, 32, 4, 13294, 4, True)


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """Empty trust decisions, orders and records (a temporary file) for this test only."""
    monkeypatch.setenv(records.VERIFY_FILE_ENV, str(tmp_path / "verified.json"))
    for name in ("_decisions", "_loaded", "_orders"):
        monkeypatch.setattr(auto, name, {})
    return tmp_path / "verified.json"


@pytest.fixture
def gpu_named(monkeypatch):
    """This process "has" a CUDA device called "Test GPU" for record look-ups only."""
    real = records.current_device_name
    monkeypatch.setattr(
        auto,
        "current_device_name",
        lambda device_type, index=None: (
            "Test GPU" if device_type == "cuda" else real(device_type, index)
        ),
    )


@pytest.fixture
def gpu_kernels(monkeypatch):
    """``mmcv`` and ``triton`` usable, as on a CUDA machine with both installed."""
    for name in ("mmcv", "triton"):
        monkeypatch.setattr(type(get_impl(name)), "unavailable_reasons", lambda self: [])


# --- item 1: mmcv ---------------------------------------------------------------------


def test_mmcv_is_registered_with_its_limits():
    impl = get_impl("mmcv")
    assert impl.DEVICES == ("cuda",)
    assert set(impl.DTYPES) == {torch.float16, torch.float32, torch.float64}


@pytest.mark.skipif(torch.cuda.is_available(), reason="states why mmcv is unusable without CUDA")
def test_mmcv_unavailable_here_says_why():
    assert "mmcv" not in msda_impls()
    assert get_impl("mmcv").unavailable_reasons() == [
        "no CUDA device (torch.cuda.is_available() is False)"
    ]


def test_mmcv_unavailable_without_cuda_ops(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(mmcv_impl, "compiled_cuda_version", lambda: None)
    (reason,) = get_impl("mmcv").unavailable_reasons()
    assert "built without CUDA" in reason
    monkeypatch.setattr(mmcv_impl, "compiled_cuda_version", lambda: "12.1")
    assert get_impl("mmcv").unavailable_reasons() == []


def test_mmcv_cpu_build_reports_no_cuda():
    """mmcv here is built with CPU ops only: its probe must say so, not claim CUDA."""
    pytest.importorskip("mmcv._ext", reason="mmcv without compiled ops")
    mmcv_impl.compiled_cuda_version.cache_clear()
    import mmcv._ext

    built = mmcv._ext.get_compiling_cuda_version()
    assert mmcv_impl.compiled_cuda_version() == (None if built == "not available" else built)


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (cuda_call(), []),
        (cuda_call(torch.float16), []),
        (cuda_call(torch.float64), []),
        (cuda_call(batch=128), []),
        (cuda_call(torch.bfloat16), ["dtype torch.bfloat16 not in"]),
        (cuda_call(batch=65), ["batch 65 > im2col_step 64"]),
        (MSDAInputs("cpu", torch.float32, 2, 30, 8, 32, 2, 10, 4, True), ["device 'cpu'"]),
        (MSDAInputs("npu", torch.float32, 2, 30, 8, 32, 2, 10, 4, True), ["device 'npu'"]),
    ],
)
def test_mmcv_not_supported_reasons(gpu_kernels, call, expected):
    reasons = get_impl("mmcv").not_supported_reasons(call)
    assert len(reasons) == len(expected)
    for reason, part in zip(reasons, expected):
        assert part in reason


def test_mmcv_stays_out_of_compiled_code():
    assert mmcv_impl.call_reasons(cuda_call(), compiling=True) == [
        "mmcv: its autograd.Function does not trace under torch.compile"
    ]


# --- item 2: auto verifies, in measured order --------------------------------------------


def test_cuda_order_without_records_puts_mmcv_first(fresh, gpu_named, gpu_kernels):
    assert auto_order("cuda") == ["mmcv", "triton", "gather", "grid_sample"]
    assert auto_order("cuda", torch.float32) == ["mmcv", "triton", "gather", "grid_sample"]


def _save(*saved: Record) -> None:
    records.save_records("cuda", "Test GPU", saved)


@pytest.mark.parametrize(
    ("triton_ms", "expected_first"), [(2.5, "triton"), (3.36, "mmcv"), (None, "mmcv")]
)
def test_cuda_order_follows_recorded_times(
    fresh, gpu_named, gpu_kernels, triton_ms, expected_first
):
    _save(
        Record("mmcv", "float32", True, "", 2.86, "ddetr-enc"),
        Record("triton", "float32", True, "", triton_ms, "ddetr-enc"),
    )
    order = auto_order("cuda", torch.float32)
    assert order[0] == expected_first and sorted(order[:2]) == ["mmcv", "triton"]
    assert order[2:] == ["gather", "grid_sample"]
    assert select_impl("auto", cuda_call()).NAME == expected_first
    # float16 has no timings of its own: float32's order it is; correctness is per dtype.
    assert auto_order("cuda", torch.float16)[0] == expected_first


def test_records_of_another_gpu_or_torch_do_not_count(fresh, gpu_named, gpu_kernels):
    records.save_records("cuda", "Other GPU", [Record("triton", "float32", True, "", 1.0)])
    assert auto_order("cuda", torch.float32)[0] == "mmcv"
    assert records.recorded("cuda", "Other GPU", "triton", torch.float32).correct
    assert records.recorded("cuda", "Test GPU", "triton", "float32") is None


def test_recorded_failure_is_skipped_with_one_warning(fresh, gpu_named, gpu_kernels):
    _save(
        Record("mmcv", "float32", False, "output: max error 3.1e-01 > 1e-04 vs grid_sample"),
        Record("triton", "float32", True, "", 3.36, "ddetr-enc"),
    )
    skipped = r"skipping 'mmcv' on cuda \(Test GPU\) float32: recorded.*3\.1e-01"
    with pytest.warns(RuntimeWarning, match=skipped):
        assert select_impl("auto", cuda_call()).NAME == "triton"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert select_impl("auto", cuda_call()).NAME == "triton"


def test_recorded_verification_replaces_the_check_on_this_cpu(fresh, monkeypatch):
    """What ``tools/misc/check_device.py --device cpu --save`` leaves behind, as ``auto`` reads
    it."""
    from npudet.utils import device_name

    real = parity.check_impl

    def check(impl, *args):
        assert impl != "cpu", "a recorded verification must replace the check"
        return real(impl, *args)

    monkeypatch.setattr(parity, "check_impl", check)
    records.save_records(
        "cpu", device_name("cpu"), [Record("cpu", "float32", False, "grad value: off")]
    )
    with pytest.warns(RuntimeWarning, match="skipping 'cpu' on cpu float32: recorded"):
        assert select_impl("auto", validate_inputs(*random_inputs())).NAME == "gather"
    records.save_records("cpu", device_name("cpu"), [Record("cpu", "float32", True)])
    assert select_impl("auto", validate_inputs(*random_inputs())).NAME == "cpu"


def test_record_file_round_trip(fresh):
    _save(Record("triton", "float32", True, "", 3.1, "ddetr-enc"))
    _save(Record("triton", "float16", False, "grad value: non-finite values"))
    _save(Record("triton", "float32", True, "", 2.9, "ddetr-enc"))  # replaces the first
    data = records.load_records()
    key = records.device_key("cuda", "Test GPU")
    assert key == "cuda|Test GPU"
    stamp = records.fingerprint("triton", "cuda")  # versions, sources: in each record
    assert stamp["torch"] == torch.__version__
    assert data["devices"][key]["records"]["triton"] == {
        "float32": {
            "correct": True,
            "error": "",
            "fwd_bwd_ms": 2.9,
            "case": "ddetr-enc",
            "key": stamp,
        },
        "float16": {
            "correct": False,
            "error": "grad value: non-finite values",
            "fwd_bwd_ms": None,
            "case": "",
            "key": stamp,
        },
    }
    assert records.recorded("cuda", "Test GPU", "triton", torch.float16) == Record(
        "triton", "float16", False, "grad value: non-finite values", key=stamp
    )


def test_record_file_of_another_format_is_refused(fresh):
    fresh.write_text('{"version": 0}')
    with pytest.raises(ValueError, match="verification file of version 2"):
        records.load_records()


def test_unreadable_record_file_leaves_auto_to_its_checks(fresh, gpu_named, gpu_kernels):
    fresh.write_text("{not json")
    with pytest.warns(RuntimeWarning, match="ignoring .*verified.json"):
        assert auto_order("cuda", torch.float32) == ["mmcv", "triton", "gather", "grid_sample"]


class WrongForTest(MSDAImpl):
    """A deliberately wrong stand-in: gather's output scaled by 1.01."""

    NAME = "wrong_for_test"
    DEVICES = ("cpu",)

    def forward(self, value, spatial_shapes, level_start_index, sampling_locations, attn):
        return 1.01 * msda_gather(
            value, spatial_shapes, level_start_index, sampling_locations, attn
        )


class WrongGradForTest(WrongForTest):
    """Right forward, value gradient x1.5."""

    NAME = "wrong_grad_for_test"

    def forward(self, value, spatial_shapes, level_start_index, sampling_locations, attn):
        value = value + 0.5 * (value - value.detach())
        return msda_gather(value, spatial_shapes, level_start_index, sampling_locations, attn)


class RaisingForTest(WrongForTest):
    NAME = "raising_for_test"

    def forward(self, *args):
        raise RuntimeError("kernel exploded\nsecond line")


@pytest.mark.parametrize(
    ("stand_in", "error"),
    [
        (WrongForTest(), r"output: max error \d\.\d\de-0[23] > 1e-04 vs grid_sample"),
        (WrongGradForTest(), r"grad value: max error \d\.\d\de-01 > 1e-04"),
        (RaisingForTest(), r"RuntimeError: kernel exploded$"),
    ],
)
def test_wrong_candidate_is_skipped_with_one_warning(fresh, monkeypatch, stand_in, error):
    monkeypatch.setitem(registry._REGISTRY, stand_in.NAME, stand_in)
    monkeypatch.setitem(auto.AUTO_PRIORITY, "cpu", [stand_in.NAME, "gather", "grid_sample"])
    inputs = random_inputs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [multi_scale_deformable_attn(*inputs) for _ in range(3)]
    assert len(caught) == 1 and caught[0].category is RuntimeWarning
    message = str(caught[0].message)
    assert message.startswith(f"npudet MSDA auto: skipping {stand_in.NAME!r} on cpu float32: ")
    assert re.search(error, message), message
    want = multi_scale_deformable_attn(*inputs, impl="gather")
    for out in outs:
        torch.testing.assert_close(out, want, rtol=0, atol=0)
    assert select_impl(stand_in.NAME, validate_inputs(*inputs)) is stand_in  # named: no check


@pytest.mark.parametrize(
    ("impl", "dtype"),
    [(i, d) for i in ("cpu", "gather") for d in (torch.float16, torch.bfloat16)]
    + [(i, d) for i in ("cpu", "gather", "grid_sample") for d in (torch.float32, torch.float64)],
)
def test_cpu_implementations_pass_the_check(impl, dtype):
    assert parity.check_impl(impl, "cpu", dtype) == ""


def test_check_on_cpu_costs_under_50ms(fresh):
    """What ``auto`` adds to a CPU process: one check of ``cpu`` for the dtype in use."""
    import time

    parity.check_impl("cpu", "cpu", torch.float32)  # loads the kernel: not the check's
    times = []
    for _ in range(5):
        start = time.perf_counter()
        assert parity.check_impl("cpu", "cpu", torch.float32) == ""
        times.append((time.perf_counter() - start) * 1e3)
    assert sorted(times)[len(times) // 2] < 50, times


def test_check_leaves_rng_and_threads_alone():
    state, threads = torch.get_rng_state(), torch.get_num_threads()
    parity.check_impl("gather", "cpu", torch.float32)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.get_num_threads() == threads


def test_check_runs_under_inference_mode_and_no_grad():
    with torch.inference_mode():
        assert parity.check_impl("gather", "cpu", torch.float32) == ""
    with torch.no_grad():
        assert parity.check_impl("gather", "cpu", torch.float32) == ""


def test_not_checked_reference_meta_and_absent_devices(fresh, monkeypatch):
    def refuse(*args):
        raise AssertionError(f"checked {args}")

    monkeypatch.setattr(parity, "check_impl", refuse)
    assert auto.untrusted_reason("grid_sample", "cpu", torch.float32) == ""
    assert auto.untrusted_reason("gather", "meta", torch.float32) == ""
    if not torch.cuda.is_available():
        assert auto.untrusted_reason("triton", "cuda", torch.float32) == ""


def test_auto_on_cpu_checks_its_choice_once_per_dtype(fresh, monkeypatch):
    calls = []
    real = parity.check_impl
    monkeypatch.setattr(parity, "check_impl", lambda *args: calls.append(args) or real(*args))
    for _ in range(3):
        multi_scale_deformable_attn(*random_inputs())
    multi_scale_deformable_attn(*random_inputs(dtype=torch.float64))
    assert calls == [("cpu", "cpu", torch.float32), ("cpu", "cpu", torch.float64)]


@DYNAMO_2_1
def test_compiled_auto_checks_outside_the_graph(fresh):
    """The check runs once, eagerly, while dynamo evaluates the trust decision as a constant."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    value, spatial, starts, loc, attn = random_inputs(queries=6)
    compiled = torch.compile(
        lambda v, l_, a: multi_scale_deformable_attn(v, spatial, starts, l_, a) * 2,
        fullgraph=True,
        backend=backend,
    )
    out = compiled(value, loc, attn)
    assert auto._decisions == {("cpu", records.current_device_name("cpu"), "cpu", "float32"): ""}
    torch.testing.assert_close(
        out, 2 * multi_scale_deformable_attn(value, spatial, starts, loc, attn)
    )
    code = "\n".join(gm.code for gm in graphs)
    assert "msda_cpu_forward" in code and "grid_sampler" not in code and "embedding_bag" not in code


# --- item 3: no host reads per call ---------------------------------------------------


class HostReads(TorchDispatchMode):
    """Counts reads of device tensors back to the host (the syncs of a CUDA/NPU call).

    The tensors are on ``meta``, which has no memory: this mode keeps a CPU shadow of the
    level tensors it is given (and of whatever is computed from them alone), and answers
    a copy to the host from that shadow. Any other read cannot be answered and raises.
    """

    def __init__(self, shadows):
        super().__init__()
        self.reads = []
        self._ids = {}
        for meta, cpu in shadows:
            self._remember(meta, cpu)

    def _remember(self, meta, cpu):
        self._ids[id(meta)] = (weakref.ref(meta), cpu)

    def _shadow(self, t):
        entry = self._ids.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        on_device = [t for t in tensors if t.device.type != "cpu"]
        to_host = kwargs.get("device") == torch.device("cpu") or (
            func is aten.copy_.default and args[0].device.type == "cpu"
        )
        if func is aten._local_scalar_dense.default or (to_host and on_device):
            self.reads.append(func)
            shadows = [self._shadow(t) for t in on_device]
            if None in shadows:
                raise RuntimeError(f"{func} read a device tensor without a shadow")
        shadows = {id(t): self._shadow(t) for t in on_device}
        if on_device and all(s is not None for s in shadows.values()):
            cpu_args, cpu_kwargs = tree_map(
                lambda a: shadows[id(a)] if isinstance(a, torch.Tensor) and id(a) in shadows else a,
                (args, kwargs),
            )
            cpu_out = func(*cpu_args, **cpu_kwargs)
            if to_host or func is aten._local_scalar_dense.default:
                return cpu_out
            out = func(*args, **kwargs)
            if isinstance(out, torch.Tensor):
                self._remember(out, cpu_out)
            return out
        return func(*args, **kwargs)


def _meta_inputs():
    cpu = random_inputs()
    return cpu, tuple(t.to("meta") for t in cpu)


@pytest.mark.parametrize("impl", ["auto", "gather"])
def test_second_call_reads_nothing_back(impl):
    cpu, (value, shapes, starts, loc, attn) = _meta_inputs()
    leaves = [t.requires_grad_() for t in (value, loc, attn)]
    mode = HostReads([(shapes, cpu[1]), (starts, cpu[2])])
    with mode:
        multi_scale_deformable_attn(leaves[0], shapes, starts, *leaves[1:], impl=impl)
    assert mode.reads == [aten._to_copy.default]  # both level tensors in one read
    mode.reads.clear()
    with mode:
        for _ in range(3):
            out = multi_scale_deformable_attn(leaves[0], shapes, starts, *leaves[1:], impl=impl)
            torch.autograd.grad(out.sum(), leaves)
    assert mode.reads == []
    assert out.device.type == "meta" and out.shape == (2, 5, 16)


def test_values_are_read_again_after_an_in_place_change():
    cpu, (value, shapes, starts, loc, attn) = _meta_inputs()
    mode = HostReads([(shapes, cpu[1]), (starts, cpu[2])])
    with mode:
        multi_scale_deformable_attn(value, shapes, starts, loc, attn, impl="gather")
        multi_scale_deformable_attn(value, shapes, starts, loc, attn, impl="gather")
        assert len(mode.reads) == 1
        starts.add_(0)  # bumps the version counter: the old check no longer stands
        multi_scale_deformable_attn(value, shapes, starts, loc, attn, impl="gather")
    assert len(mode.reads) == 2


def test_bad_values_are_still_caught_after_a_good_call():
    value, shapes, starts, loc, attn = random_inputs()
    multi_scale_deformable_attn(value, shapes, starts, loc, attn)
    starts[1] += 1  # in place: same tensor, new version
    with pytest.raises(ValueError, match="level_start_index"):
        multi_scale_deformable_attn(value, shapes, starts, loc, attn)
    with pytest.raises(ValueError, match="level_start_index"):
        multi_scale_deformable_attn(value, shapes, starts.clone(), loc, attn)
    starts[1] -= 1
    with pytest.raises(ValueError, match="spatial_shapes"):  # a different num_keys
        multi_scale_deformable_attn(value[:, :-1], shapes, starts, loc, attn)


def test_a_write_past_the_version_counter_is_the_documented_limit():
    """docs/ops/index.md: a write through ``.data`` does not bump ``_version``, so the call
    after it reuses the earlier check (grid_sample, which reads only spatial_shapes, then
    runs); the same write through the tensor is caught."""
    value, shapes, starts, loc, attn = random_inputs()
    multi_scale_deformable_attn(value, shapes, starts, loc, attn, impl="grid_sample")
    version = starts._version
    starts.data[1] += 1
    assert starts._version == version
    multi_scale_deformable_attn(value, shapes, starts, loc, attn, impl="grid_sample")
    starts.data[1] -= 1
    starts[1] += 1
    with pytest.raises(ValueError, match="level_start_index"):
        multi_scale_deformable_attn(value, shapes, starts, loc, attn, impl="grid_sample")


# --- item 6: variants and package probes ---------------------------------------------


def test_variants_have_a_name_space_of_their_own():
    assert msda_variants() == VARIANTS
    assert not set(VARIANTS) & set(msda_impls())
    assert not set(VARIANTS) & set(auto_order("cpu"))
    inputs = random_inputs()
    torch.testing.assert_close(
        multi_scale_deformable_attn(*inputs, impl="cpu_atomic"),
        multi_scale_deformable_attn(*inputs, impl="cpu"),
    )
    with pytest.raises(ValueError, match=r"experiment variants: \['cpu_atomic'"):
        get_impl("cpu_fast")


def test_ablation_default_takes_the_devices_own_implementations(gpu_kernels):
    from npudet.ablation.variants import default_impls

    assert default_impls("cpu") == "grid_sample,gather,cpu"
    assert default_impls("cuda") == "grid_sample,gather,mmcv,triton"


def test_op_library_imports_only_torch():
    """Importing and listing never imports mmcv/mmdet/mmengine (mmcv is probed on CUDA only)."""
    code = (
        "import sys, torch, npudet.ops\n"
        "npudet.ops.msda_impls()\n"
        "found = {m.split('.')[0] for m in sys.modules} & {'mmcv', 'mmdet', 'mmengine'}\n"
        "print(sorted(found - ({'mmcv', 'mmengine'} if torch.cuda.is_available() else set())))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
