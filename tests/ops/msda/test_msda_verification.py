"""Recorded verifications hold for what was verified: sources, CPU ISA, versions, driver.

A record written by ``tools/misc/check_device.py --save`` carries the fingerprint of the process
that verified it; ``auto`` trusts it only while this process's fingerprint is the same.
Records live in a temporary ``NPUDET_VERIFY_FILE``; the checks that run, run on the CPU.
"""

from __future__ import annotations

import json
import logging
from typing import Iterator, List

import pytest
import torch

from npudet.ops.msda import auto, get_impl, msda_impls, registered_impls
from npudet.ops.msda.verification import parity, records
from npudet.ops.msda.verification.records import Record
from npudet.utils.device import device_name


class _Lines(logging.Handler):
    """Collects the messages of one logger (whatever handlers the ``npudet`` logger has)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def fresh(monkeypatch, tmp_path) -> Iterator[_Lines]:
    """Empty per-process state and record file; the verification logger's lines."""
    monkeypatch.setenv(records.VERIFY_FILE_ENV, str(tmp_path / "verified.json"))
    for name in ("_decisions", "_loaded", "_orders"):
        monkeypatch.setattr(auto, name, {})
    monkeypatch.setattr(auto, "_stale_logged", set())
    lines = _Lines()
    auto.logger.addHandler(lines)
    caches = (records.fingerprint, records.source_digest)  # tests may replace them
    for cache in caches:
        cache.cache_clear()
    yield lines
    auto.logger.removeHandler(lines)
    for cache in caches:
        cache.cache_clear()


@pytest.fixture
def checks(monkeypatch) -> List[str]:
    """The implementations ``check_impl`` runs for, in order (each check still runs)."""
    ran: List[str] = []
    real = parity.check_impl

    def check(impl, *args):
        ran.append(impl)
        return real(impl, *args)

    monkeypatch.setattr(parity, "check_impl", check)
    return ran


def _new_process() -> None:
    """What a later process starts with: no decisions, records unread, fingerprints unknown."""
    auto.reset()
    records.fingerprint.cache_clear()
    records.source_digest.cache_clear()


def test_key_holds_sources_build_versions_and_driver(fresh):
    key = records.fingerprint("gather", "cpu")
    assert list(key) == ["sources", "build", *records.KEY_PACKAGES, "driver", "toolkit"]
    assert key["torch"] == torch.__version__ and key["build"] is None
    assert key["driver"] is None and key["toolkit"] is None  # the CPU has neither
    assert (
        len(key["sources"]) == 16
        and key["sources"] != records.fingerprint("triton", "cpu")["sources"]
    )
    assert records.fingerprint("gather", "cpu") is key  # once per process


def test_npu_key_names_the_cann_toolkit(fresh, monkeypatch):
    monkeypatch.setattr(torch.version, "cann", "8.0.RC2", raising=False)
    assert records.fingerprint("gather", "npu")["toolkit"] == "8.0.RC2"
    assert records.fingerprint("gather", "cpu")["toolkit"] is None
    old = records.Record("gather", "float32", True, key=dict(records.fingerprint("gather", "npu")))
    records.fingerprint.cache_clear()
    monkeypatch.setattr(torch.version, "cann", "8.1.RC1")
    assert records.stale_reasons(old, "npu") == ["toolkit 8.0.RC2 -> 8.1.RC1"]


@pytest.mark.skipif("cpu" not in msda_impls(), reason="cpu kernel did not build")
def test_cpu_key_names_the_build_and_every_file_that_shapes_it(fresh):
    from npudet.ops.msda.backends import cpu_library
    from npudet.ops.msda.kernels.native_build import compiler_version

    build = records.fingerprint("cpu_atomic", "cpu")["build"]
    assert build == f"{cpu_library.isa()}; {compiler_version()}"
    assert "unavailable" not in build
    sources = records.implementation_sources("cpu_atomic")
    assert sources[0].endswith("backends/cpu.py")
    # The C++ folder, and the Python that picks the flags and builds it.
    for entry in ("native:msda_cpu/", "backends/cpu_isa.py", "kernels/native_build.py"):
        assert entry in sources
    names = [name for name, path in records._source_files("native:msda_cpu/") if path]
    assert {"msda_cpu.cpp", "msda_cpu_ops.cpp", "msda_cpu_autograd.cpp"} <= set(names)


def test_every_listed_kernel_source_exists():
    """A renamed or moved kernel file must not drop out of the key unnoticed."""
    for impl in registered_impls():
        for name in records.implementation_sources(impl):
            if not name.startswith("env:"):  # a library built on the machine, if any
                assert records._source_path(name) is not None, name


def test_a_library_named_by_the_environment_is_part_of_the_key(monkeypatch, tmp_path):
    """mmcv's cuda_lib route runs the library $NPUDET_MMCV_CUDA_LIB names: a rebuild is stale."""
    assert "env:NPUDET_MMCV_CUDA_LIB" in records.implementation_sources("mmcv")
    digest = records.source_digest.__wrapped__
    entry = ("env:NPUDET_MMCV_CUDA_LIB",)
    monkeypatch.delenv("NPUDET_MMCV_CUDA_LIB", raising=False)
    unset = digest(entry)
    library = tmp_path / "libmsda.so"
    library.write_bytes(b"build 1")
    monkeypatch.setenv("NPUDET_MMCV_CUDA_LIB", str(library))
    first = digest(entry)
    library.write_bytes(b"build 2")
    assert len({unset, first, digest(entry)}) == 3


def test_source_digest_follows_file_contents(tmp_path):
    digest = records.source_digest.__wrapped__  # uncached: the files change here
    source = tmp_path / "kernel.cpp"
    source.write_text("int f() { return 1; }\n")
    first = digest((str(source),))
    source.write_text("int f() { return 2; }\n")
    assert digest((str(source),)) != first
    missing = digest((str(tmp_path / "gone.cpp"),))
    assert missing not in (first, digest((str(source),)))
    folder = str(tmp_path) + "/"  # a folder entry: every file in it
    before = digest((folder,))
    (tmp_path / "kernel.h").write_text("#pragma once\n")
    assert digest((folder,)) != before


def test_changed_source_reverifies_with_one_log_line(fresh, checks, monkeypatch, tmp_path):
    """An edit of a kernel file makes the record stale: one line, then the check runs."""
    kernel = tmp_path / "gather_kernel.py"
    kernel.write_text("# version 1\n")
    monkeypatch.setattr(type(get_impl("gather")), "SOURCES", (str(kernel),))
    records.save_records("cpu", device_name("cpu"), [Record("gather", "float32", True)])
    _new_process()
    assert auto.untrusted_reason("gather", "cpu", torch.float32) == ""
    assert checks == [] and fresh.lines == []  # current record: trusted, not checked

    kernel.write_text("# version 2\n")
    _new_process()
    assert auto.untrusted_reason("gather", "cpu", torch.float32) == ""
    assert checks == ["gather"]
    (line,) = fresh.lines
    assert "'gather' float32 on cpu" in line and "stale (kernel sources" in line
    assert auto.measured_order(["gather", "grid_sample"], "cpu", torch.float32)
    assert len(fresh.lines) == 1  # the same stale record is not reported twice


def test_recorded_failure_stops_counting_after_an_upgrade(fresh, checks, monkeypatch):
    """A version change re-verifies: a recorded failure no longer skips the implementation."""
    name = device_name("cpu")
    records.save_records("cpu", name, [Record("gather", "float32", False, "grad: off")])
    _new_process()
    with pytest.warns(RuntimeWarning, match="skipping 'gather' on cpu float32: recorded"):
        assert auto.untrusted_reason("gather", "cpu", torch.float32)
    assert checks == []

    real = records._distribution_version
    monkeypatch.setattr(
        records,
        "_distribution_version",
        lambda package: "9.9.9" if package == "torch" else real(package),
    )
    _new_process()
    assert auto.untrusted_reason("gather", "cpu", torch.float32) == ""
    assert checks == ["gather"]
    assert f"torch {torch.__version__} -> 9.9.9" in fresh.lines[0]


def test_recorded_order_is_dropped_when_stale(fresh, monkeypatch):
    """``auto``'s measured order uses only current records: stale times do not reorder."""
    name = device_name("cpu")
    saved = [Record("gather", "float32", True, "", 1.0), Record("cpu", "float32", True, "", 9.0)]
    monkeypatch.setattr(records, "fingerprint", lambda impl, device: {"sources": "a"})
    records.save_records("cpu", name, saved)
    auto.reset()
    assert auto.measured_order(["cpu", "gather"], "cpu", torch.float32) == ["gather", "cpu"]
    monkeypatch.setattr(records, "fingerprint", lambda impl, device: {"sources": "b"})
    auto.reset()
    assert auto.measured_order(["cpu", "gather"], "cpu", torch.float32) == ["cpu", "gather"]
    assert sorted(line.split("'")[1] for line in fresh.lines) == ["cpu", "gather"]


def test_driver_versions_are_read_from_the_driver_files(monkeypatch, tmp_path):
    nvidia, ascend = tmp_path / "nvidia", tmp_path / "ascend"
    nvidia.write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build\n"
        "GCC version:  gcc version 12.3.0\n"
    )
    ascend.write_text("Version=24.1.rc2\nascendhal_version=7.35.19\n")
    monkeypatch.setattr(records, "_DRIVER_FILES", {"cuda": str(nvidia), "npu": str(ascend)})
    assert records.driver_version("cuda") == "580.159.04"
    assert records.driver_version("npu") == "24.1.rc2"
    assert records.driver_version("cpu") is None
    nvidia.unlink()
    assert records.driver_version("cuda") is None


def test_save_replaces_a_file_of_the_older_format(fresh, tmp_path):
    path = tmp_path / "verified.json"
    path.write_text(json.dumps({"version": 1, "devices": {"cpu|x|torch 1": {"records": {}}}}))
    with pytest.warns(RuntimeWarning, match="ignoring .*verification file of version 2"):
        assert auto.untrusted_reason("gather", "cpu", torch.float32) == ""
    records.save_records("cpu", "x", [Record("gather", "float32", True)])
    data = json.loads(path.read_text())
    assert data["version"] == records.FORMAT_VERSION and list(data["devices"]) == ["cpu|x"]
