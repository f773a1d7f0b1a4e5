"""The GPU kit's orchestrator: parts in child processes, a time budget, one report.

Order (most wanted first, so a run cut short keeps it): mmcv's CUDA library starts
building in the background (CPU work) while ``torch.compile`` of an encoder layer with
``triton`` runs on the GPU; then the float32 benchmark (model and training-size cases, the
four implementations), the training iterations, the host's cost per call
(``tools/analysis_tools/benchmark_msda.py --host``), the half-precision benchmarks,
``tools/misc/check_device.py`` (parity, its own benchmark), and last the compile check with
``grid_sample``.
Every part gets what is left of the budget, at most its cap; the report is rewritten after
each part. ``dry_run`` runs the same parts on small shapes (seconds, on the CPU).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import torch

from npudet.benchmark.cases import CASES, LARGE_CASES
from npudet.ops.msda import get_impl, msda_impls
from npudet.ops.msda.backends import mmcv_cuda_lib
from npudet.utils.environment import environment_report

from . import child, report
from .child import write_json

ROOT = Path(__file__).resolve().parents[3]
IMPLS = ("grid_sample", "gather", "triton", "mmcv")
# Implementations per benchmark dtype: mmcv has no bfloat16 kernel, so half precision is
# measured twice: bfloat16 (what training uses) and float16 (where mmcv can take part).
DTYPE_IMPLS = {
    "float32": IMPLS,
    "float16": ("grid_sample", "triton", "mmcv"),
    "bfloat16": ("grid_sample", "gather", "triton"),
}
DEFAULT_BUDGET_S = {"gpu": 540.0, "dry": 300.0}
MIN_PART_S = 15.0  # a part is not started with less time than this left


@dataclass
class Part:
    """One step of the plan: a child process (``cmd``), at most ``cap_s`` seconds."""

    name: str
    cmd: List[str]
    cap_s: float
    json: Optional[Path] = None


# Run with NPUDET_TEST_DEVICE set to the kit's device (tests/msda_util.py).
DEVICE_TESTS = ("tests/ops/msda/test_msda_int64.py", "tests/ops/msda/test_msda_graph_capture.py")


CARRY_LIMIT = 64 * 2**20  # bytes of working tree + carried paths a device run may take


def travel_bytes(carry: List[Path]) -> int:
    """Bytes a device run sends: tracked and untracked-not-ignored files, and ``carry``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    tree = sum((ROOT / f).stat().st_size for f in listed if f and (ROOT / f).is_file())
    return tree + sum(mmcv_cuda_lib.folder_bytes(p) for p in carry)


def junit_summary(path: Path) -> dict:
    """pytest's JUnit XML -> {"passed": n, "skipped": n, "failed": [test ids with message]}."""
    import xml.etree.ElementTree as ET

    summary: dict = {"passed": 0, "skipped": 0, "failed": []}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            summary["failed"].append(f"{name}: {(problem.get('message') or '')[:300]}")
        elif case.find("skipped") is not None:
            summary["skipped"] += 1
        else:
            summary["passed"] += 1
    return summary


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def usable(name: str, device: str, mmcv_lib: bool) -> bool:
    """Whether ``name`` can run on ``device`` here: mmcv by the built library (or mmcv's
    own ops), triton on accelerators only (on the CPU it is the interpreter's test path)."""
    if name == "mmcv":
        return device == "cuda" and (mmcv_lib or "mmcv" in msda_impls())
    if name == "triton" and device == "cpu":
        return False
    return name in msda_impls() and device in get_impl(name).DEVICES


def bench_plan(dtype: str, device: str, dry_run: bool, mmcv_lib: bool):
    """(cases, implementations, timed rounds, cap in s) of the benchmark part in ``dtype``:
    the five model cases and the three training-size ones (a dry run: one tiny case)."""
    impls = [n for n in DTYPE_IMPLS[dtype] if usable(n, device, mmcv_lib)]
    if dry_run:
        return [child.DRY_CASE.name], impls, 1, 60.0
    return [*CASES, *LARGE_CASES], impls, 10, 150.0 if dtype == "float32" else 100.0


def _kill_group(proc: subprocess.Popen) -> None:
    """End a child and everything it started (check_device's own children too)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _child_env(extra: Dict[str, str]) -> Dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", **extra)
    # npudet and npudet_dev from this checkout, installed or not (the GPU machine runs it bare).
    roots = [str(ROOT), str(ROOT / "dev")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*roots, env.get("PYTHONPATH")]))
    return env


def start(cmd: List[str], env: Dict[str, str], log) -> subprocess.Popen:
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def finish(proc: subprocess.Popen, timeout: float) -> str:
    """Wait up to ``timeout`` s: "ok", "failed (exit N)" or "timeout"."""
    try:
        code = proc.wait(timeout=max(timeout, 0.1))
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return "timeout"
    return "ok" if code == 0 else f"failed (exit {code})"


class Kit:
    """State of one run: the plan, the clock, the report so far."""

    def __init__(
        self, device: str, out: Path, dry_run: bool, budget_s: Optional[float], bundle: Path
    ):
        self.device, self.out, self.dry_run = device, out, dry_run
        self.budget_s = budget_s or DEFAULT_BUDGET_S["dry" if dry_run else "gpu"]
        self.bundle = bundle
        self.start = time.perf_counter()
        # The parts' own JSON files: outside ``out``, whose files a device run brings back.
        self._work = tempfile.TemporaryDirectory(prefix="gpu_kit_")
        self.work = Path(self._work.name)
        env = environment_report(device)
        gpu = env.get("device", {}).get("name", device) if device == "cuda" else device
        self.slug = slug(gpu) + ("-dry-run" if dry_run else "")
        self.log = open(out / f"{self.slug}.log", "w")
        # A dry run checks the plumbing, not speed: one thread per child keeps a shared,
        # busy CPU from spending its time in OpenMP's waits.
        self.env: Dict[str, str] = {"OMP_NUM_THREADS": "1"} if dry_run else {}
        self.mmcv_lib = False  # whether mmcv's library was built and loads (wait_build)
        self.build_json = self.work / "build.json"
        self.build_began = 0.0
        self.report: dict = {
            "tool": "gpu_kit",
            "version": 1,
            "device": device,
            "gpu": gpu,
            "dry_run": dry_run,
            "budget_s": self.budget_s,
            "environment": env,
            "parts": {},
            "mmcv_build": None,
            "bench": {"rows": [], "errors": {}},
            "train": [],
            "compile": [],
            "host_cost": None,
            "check": None,
            "device_tests": None,
        }

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.start)

    def note(self, part: str, status: str, seconds: float = 0.0, **extra) -> None:
        self.report["parts"][part] = {"status": status, "seconds": round(seconds, 1), **extra}
        print(f"[gpu_kit] {part}: {status} ({seconds:.0f} s, {self.left():.0f} s left)", flush=True)

    def save(self) -> None:
        self.report["seconds"] = round(time.perf_counter() - self.start, 1)
        write_json(self.out / f"{self.slug}.json", self.report)
        (self.out / f"{self.slug}.md").write_text(report.markdown(self.report))

    def run_part(self, part: Part) -> Optional[dict]:
        """Run ``part`` within the budget; its JSON, or None."""
        timeout = min(part.cap_s, self.left())
        if timeout < MIN_PART_S:
            self.note(part.name, "skipped: out of time")
            return None
        began = time.perf_counter()
        self.log.write(f"\n### {part.name}: {' '.join(part.cmd)}\n")
        self.log.flush()
        status = finish(start(part.cmd, _child_env(self.env), self.log), timeout)
        payload = None
        if part.json is not None and part.json.is_file():
            payload = json.loads(part.json.read_text())
        self.note(part.name, status, time.perf_counter() - began)
        return payload

    # -- the parts --------------------------------------------------------------------

    def _child(self, *args: str) -> List[str]:
        return [sys.executable, "-m", "npudet_dev.gpu_kit.child", *args]

    def start_build(self) -> Optional[subprocess.Popen]:
        """mmcv's library, built in the background; None when it cannot be."""
        if self.device != "cuda":
            self.note("mmcv_build", "skipped: no CUDA device")
            return None
        if not (self.bundle / mmcv_cuda_lib.KERNEL).is_file():
            self.note(
                "mmcv_build", f"skipped: no bundle at {self.bundle} (dev/tools/gpu_kit.py bundle)"
            )
            return None
        cmd = self._child("build", "--json", str(self.build_json), "--sources", str(self.bundle))
        cmd += ["--build-dir", str(self.bundle.parent / "build")]
        self.build_began = time.perf_counter()
        self.log.write(f"\n### mmcv_build (background): {' '.join(cmd)}\n")
        self.log.flush()
        return start(cmd, _child_env({}), self.log)

    def wait_build(self, proc: Optional[subprocess.Popen]) -> bool:
        """Wait for the build (within the budget); True when the library is there."""
        if proc is None:
            return False
        status = finish(proc, self.left() - MIN_PART_S)
        record = json.loads(self.build_json.read_text()) if self.build_json.is_file() else {}
        self.report["mmcv_build"] = record
        library = record.get("library")
        if status == "ok" and library:
            self.env[mmcv_cuda_lib.LIB_ENV] = str(Path(library).resolve())
        self.note(
            "mmcv_build", status, time.perf_counter() - self.build_began, error=record.get("error")
        )
        return mmcv_cuda_lib.LIB_ENV in self.env

    def bench_part(self, dtype: str, mmcv_lib: bool) -> Optional[Part]:
        cases, impls, repeat, cap = bench_plan(dtype, self.device, self.dry_run, mmcv_lib)
        if not any(n != "grid_sample" for n in impls):
            self.note(f"bench_{dtype}", "skipped: no implementation to compare here")
            return None
        path = self.work / f"bench_{dtype}.json"
        cmd = self._child("bench", "--json", str(path), "--device", self.device, "--dtype", dtype)
        cmd += ["--cases", ",".join(cases), "--impls", ",".join(impls), "--repeat", str(repeat)]
        return Part(f"bench_{dtype}", cmd, cap, path)

    def model_part(self, kind: str, impl: str) -> Part:
        path = self.work / f"{kind}_{impl}.json"
        cmd = self._child(kind, "--json", str(path), "--device", self.device, "--impl", impl)
        cmd += ["--dry-run"] if self.dry_run else []
        cap = 40.0 if self.dry_run else (150.0 if kind == "compile" else 60.0)
        return Part(f"{kind}_{impl}", cmd, cap, path)

    def run_model_part(self, kind: str, impl: str) -> None:
        part = self.model_part(kind, impl)
        result = self.run_part(part) or {"impl": impl}
        status = self.report["parts"][part.name]["status"]
        if status != "ok":  # the child's own error first, when it wrote one
            result["error"] = result.get("error") or status
        self.report[kind].append(result)
        self.save()

    def run_bench(self, dtype: str, mmcv_lib: bool) -> None:
        part = self.bench_part(dtype, mmcv_lib)
        payload = self.run_part(part) if part else None
        if payload:
            self.report["bench"]["rows"].extend(payload["rows"])
            self.report["bench"]["errors"].update(
                {f"{spec} {dtype}": err for spec, err in payload["errors"].items()}
            )
        self.save()

    def run_host_cost(self) -> None:
        """``tools/analysis_tools/benchmark_msda.py --host``: what one call costs the host, per
        implementation (a tool option that may be absent: then the part fails and says so)."""
        path = self.work / "host_cost.json"
        impls = [n for n in IMPLS if usable(n, self.device, self.mmcv_lib)]
        cmd = [
            sys.executable,
            str(ROOT / "tools" / "analysis_tools" / "benchmark_msda.py"),
            "--host",
        ]
        cmd += ["--device", self.device, "--impls", ",".join(impls), "--json", str(path)]
        cmd += ["--repeat", "1" if self.dry_run else "3"]
        payload = self.run_part(Part("host_cost", cmd, 90.0, path))
        self.report["host_cost"] = payload.get("results") if payload else None
        self.save()

    def run_check(self) -> None:
        path = self.out / f"{self.slug}-check_device.json"
        cmd = [
            sys.executable,
            str(ROOT / "tools" / "misc" / "check_device.py"),
            "--device",
            self.device,
        ]
        cmd += ["--json", str(path), "--fast" if self.dry_run else "--no-compile"]
        cmd += ["--impls", ",".join(n for n in IMPLS if usable(n, self.device, self.mmcv_lib))]
        payload = self.run_part(Part("check_device", cmd, 240.0, path))
        if payload:
            self.report["check"] = {
                "file": path.name,
                "seconds": payload.get("seconds"),
                "skipped": payload.get("skipped"),
                "summary": payload.get("summary"),
            }
        self.save()

    def run_device_tests(self) -> None:
        """The device-parametrised tests no other part covers (``NPUDET_TEST_DEVICE``): int64
        indexing past 2**31 elements, CUDA-graph replay and reduce-overhead compile."""
        xml = self.work / "device_tests.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *DEVICE_TESTS]
        cmd += [f"--junitxml={xml}"]
        env = dict(self.env, NPUDET_TEST_DEVICE=self.device)
        timeout = min(240.0, self.left())
        if timeout < MIN_PART_S:
            self.note("device_tests", "skipped: out of time")
            return
        began = time.perf_counter()
        self.log.write(f"\n### device_tests: {' '.join(cmd)}\n")
        self.log.flush()
        status = finish(start(cmd, _child_env(env), self.log), timeout)
        self.report["device_tests"] = junit_summary(xml) if xml.is_file() else None
        self.note("device_tests", status, time.perf_counter() - began)
        self.save()

    def run(self) -> dict:
        """The whole plan; the report (also written to ``out``)."""
        try:
            self.save()
            build = self.start_build()
            compiles = [n for n in ("triton", "grid_sample") if usable(n, self.device, False)]
            if compiles:
                self.run_model_part("compile", compiles[0])
            self.mmcv_lib = self.wait_build(build)
            self.run_bench("float32", self.mmcv_lib)
            for impl in ("triton", "grid_sample", "mmcv", "gather"):
                if usable(impl, self.device, self.mmcv_lib):
                    self.run_model_part("train", impl)
            self.run_host_cost()
            self.run_bench("float16", self.mmcv_lib)
            self.run_bench("bfloat16", self.mmcv_lib)
            self.run_check()
            self.run_device_tests()
            for impl in compiles[1:]:
                self.run_model_part("compile", impl)
        finally:
            self.log.close()
            self._work.cleanup()
        return self.report


def run_kit(
    device: str,
    out: Path,
    dry_run: bool = False,
    budget_s: Optional[float] = None,
    bundle: Path = ROOT / ".gpu_kit" / mmcv_cuda_lib.BUNDLE_DIR,
) -> dict:
    """Run the kit on ``device`` ("cuda", or "cpu" for a dry run); writes ``out/<gpu>.json``,
    ``.md``, ``.log`` and the device check's JSON; returns the report."""
    out.mkdir(parents=True, exist_ok=True)
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: torch.cuda.is_available() is False")
    return Kit(device, out, dry_run, budget_s, bundle).run()
