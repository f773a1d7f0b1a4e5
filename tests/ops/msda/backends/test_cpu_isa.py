"""Run-time instruction-set dispatch of the CPU kernel (``npudet.ops.msda.backends.cpu_isa``).

The choice is checked on made-up CPUs; then every variant this CPU can run (and the
opt-in ``native``) is built and held to parity with grid_sample, each in a subprocess with
``NPUDET_CPU_ISA`` set. The builds share the user's extension cache (about a minute each
when it is empty; the subprocesses build side by side).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from msda_util import random_inputs

from npudet.ops.msda import multi_scale_deformable_attn
from npudet.ops.msda.backends import cpu as cpu_impl
from npudet.ops.msda.backends import cpu_isa, cpu_library
from npudet.ops.msda.kernels.native_build import cache_dir

CHECK = Path(__file__).resolve().parent / "cpu_variant_check.py"
V2 = frozenset(cpu_isa.VARIANTS["x86_64"][2].features)
V3 = frozenset(cpu_isa.VARIANTS["x86_64"][1].features)
V4 = frozenset(cpu_isa.VARIANTS["x86_64"][0].features)


def names(variants):
    return [v.name for v in variants]


@pytest.mark.parametrize(
    "flags, best",
    [(V4 | {"sse2"}, "avx512"), (V3, "avx2"), (V4 - {"avx512vl"}, "avx2"), (V2, "baseline")],
)
def test_auto_takes_the_best_variant_the_cpu_runs(flags, best):
    got = cpu_isa.candidates("auto", "x86_64", flags)
    assert got[0].name == best
    # The rest are build fallbacks, best first, never native.
    order = ["avx512", "avx2", "baseline"]
    assert names(got) == order[order.index(best) :]


def test_variant_flags():
    marches = {v.name: v.march for v in cpu_isa.VARIANTS["x86_64"]}
    assert marches == {
        "avx512": "-march=x86-64-v4",
        "avx2": "-march=x86-64-v3",
        "baseline": "-march=x86-64-v2",
    }
    (arm,) = cpu_isa.candidates("auto", "aarch64", frozenset({"fp", "asimd"}))
    assert (arm.name, arm.march) == ("baseline", "-march=armv8-a")
    assert cpu_isa.candidates("native", "x86_64", V2) == [cpu_isa.NATIVE]
    assert cpu_isa.candidates(" AVX2 ", "x86_64", V4)[0].name == "avx2"


def test_a_variant_the_cpu_cannot_run_is_refused_naming_the_variable():
    refused = cpu_isa.candidates("avx512", "x86_64", V3)
    assert isinstance(refused, str)
    assert "NPUDET_CPU_ISA='avx512'" in refused and "avx512f" in refused
    assert "['avx2', 'baseline', 'native']" in refused
    unknown = cpu_isa.candidates("avx9", "x86_64", V4)
    assert isinstance(unknown, str) and "NPUDET_CPU_ISA='avx9': expected one of" in unknown
    assert "avx512" in cpu_isa.candidates("avx512", "aarch64", frozenset())
    assert "NPUDET_CPU_ISA=native" in cpu_isa.candidates("auto", "riscv64", frozenset())


def test_forced_refusal_reaches_the_caller(monkeypatch):
    monkeypatch.setenv(cpu_isa.ENV, "avx512")
    monkeypatch.setattr(cpu_isa, "machine", lambda: "x86_64")
    monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: V2)
    monkeypatch.setattr(cpu_library, "_state", {})
    (reason,) = cpu_impl.CPUImpl().unavailable_reasons()
    assert "NPUDET_CPU_ISA='avx512'" in reason
    assert cpu_library.isa() is None
    value, spatial, starts, loc, attn = random_inputs()
    with pytest.raises(ValueError, match="NPUDET_CPU_ISA='avx512'"):
        multi_scale_deformable_attn(value, spatial, starts, loc, attn, impl="cpu")


def test_this_cpu_reads_as_proc_cpuinfo_says():
    flags = cpu_isa.cpu_flags()
    if flags is None:
        pytest.skip("no /proc/cpuinfo on this system (variants then follow ATen's capability)")
    runnable = names(cpu_isa.runnable())
    if cpu_isa.machine() == "x86_64":
        assert ("avx512" in runnable) == (V4 <= flags)
        assert ("avx2" in runnable) == (V3 <= flags)
    # The process's kernel is the first candidate (NPUDET_CPU_ISA as the run sets it).
    assert cpu_library.isa() == cpu_isa.candidates()[0].name


def test_cache_is_keyed_by_variant(tmp_path):
    src = tmp_path / "k.cpp"
    src.write_text("int f() { return 1; }\n")
    v3 = cache_dir("k", [src], ["-march=x86-64-v3"])
    v4 = cache_dir("k", [src], ["-march=x86-64-v4"])
    native = cache_dir("k", [src], ["-march=native"], cpu_specific=True)
    assert len({v3, v4, native}) == 3 and v3 == cache_dir("k", [src], ["-march=x86-64-v3"])


# Every variant this CPU runs, plus the opt-in native build; their builds start together.
VARIANTS = [*names(cpu_isa.runnable()), cpu_isa.NATIVE.name]


@pytest.fixture(scope="module")
def variant_runs():
    """One running ``cpu_variant_check.py`` per variant, started side by side."""
    runs = {}
    for name in VARIANTS:
        env = {**os.environ, cpu_isa.ENV: name}
        runs[name] = subprocess.Popen(
            [sys.executable, str(CHECK)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    yield runs
    for proc in runs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_matches_grid_sample(variant_runs, variant):
    out, err = variant_runs[variant].communicate(timeout=600)
    assert variant_runs[variant].returncode == 0, err.decode()[-3000:]
    report = json.loads(out.decode().strip().splitlines()[-1])
    assert report["isa"] == variant and "cpu" in report["impls"]
    assert len(report["checked"]) > 1  # the experiment variants were held to parity too
