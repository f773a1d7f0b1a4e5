"""The simulated NPU where ordinary user code meets torch_npu's API: pinned memory and
non_blocking copies, a generator per device, timed events and streams, ``torch_npu.npu.profile``
under mmengine's ``NPUProfilerHook``, forked workers refused as torch_npu refuses them, and
what the simulation still lacks failing as its README says."""

from __future__ import annotations

import builtins
import importlib
import logging
import os
import re
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest
import torch
from npu_sim_util import ENV, REPO, SIM_PATH, npu_env
from table_util import markdown_rows
from torch.utils.data import DataLoader, TensorDataset


def test_pinned_memory_and_non_blocking_copies_both_ways(simulated_npu):
    x = torch.randn(4, 5)
    pinned = x.pin_memory()
    assert pinned.is_pinned() and pinned[1:].is_pinned() and not x.is_pinned()
    assert torch.equal(pinned, x)
    on_npu = pinned.to("npu", non_blocking=True)
    also = x.npu(non_blocking=True)
    torch.npu.synchronize()
    assert on_npu.device.type == "npu" and torch.equal(also.cpu(), x)
    back = on_npu.to("cpu", non_blocking=True)
    torch.npu.synchronize()
    assert back.is_pinned() and torch.equal(back, x)
    batch = next(iter(DataLoader(TensorDataset(x), batch_size=2, pin_memory=True)))[0]
    assert batch.is_pinned() and torch.equal(batch, x[:2])


def test_each_device_has_a_generator_apart_from_the_cpus(simulated_npu):
    torch.manual_seed(0)  # seeds the CPU and, through torch.npu.manual_seed_all, every npu
    cpu_state = torch.get_rng_state()
    torch.npu.manual_seed(3)
    first = torch.rand(5, device="npu")
    torch.nn.functional.dropout(torch.ones(64, device="npu"), 0.5, training=True)
    torch.ones(8, device="npu").bernoulli_(0.5)
    torch.randn(3, device="npu:1")
    assert torch.equal(torch.get_rng_state(), cpu_state), "npu draws moved the CPU generator"
    assert torch.npu.initial_seed() == 3 and torch.npu.default_generators[1].initial_seed() == 0
    torch.npu.manual_seed(3)
    assert torch.equal(torch.rand(5, device="npu"), first)
    state = torch.npu.get_rng_state()
    drawn = torch.randn(6, device="npu")
    torch.npu.set_rng_state(state)
    assert torch.equal(torch.randn(6, device="npu"), drawn)
    before = torch.npu.get_rng_state()
    generator = torch.Generator("npu")
    assert generator.device.type == "npu"
    generator.manual_seed(7)
    mine = torch.rand(4, device="npu", generator=generator)
    generator.manual_seed(7)
    assert torch.equal(torch.rand(4, device="npu", generator=generator), mine)
    assert torch.equal(torch.npu.get_rng_state(), before), "a private generator moved the default"
    with pytest.raises(RuntimeError, match="Expected a 'npu' device type for generator"):
        torch.rand(2, device="npu", generator=torch.Generator())


def test_events_time_the_work_between_records_and_streams_are_accepted(simulated_npu):
    start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
    start.record()
    time.sleep(0.05)
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 45 and end.query()
    plain = [torch.Event("npu", enable_timing=True) for _ in range(2)]  # the native events
    plain[0].record()
    time.sleep(0.02)
    plain[1].record()
    assert plain[0].elapsed_time(plain[1]) >= 15
    untimed = torch.npu.Event()
    untimed.record()
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        untimed.elapsed_time(end)
    with pytest.raises(RuntimeError, match="Both events must be recorded"):
        torch.npu.Event(enable_timing=True).elapsed_time(end)

    side = torch.npu.Stream()
    assert side != torch.npu.default_stream() == torch.npu.current_stream()
    with torch.npu.stream(side):
        assert torch.npu.current_stream() == side
        tensor = torch.ones(3, device="npu")
        tensor.record_stream(side)
    assert torch.npu.current_stream() == torch.npu.default_stream()
    with torch.npu.StreamContext(side):
        assert torch.npu.current_stream() == side
    side.wait_stream(torch.npu.current_stream())
    side.synchronize()
    assert side.query() and "device ID 0" in torch.npu.memory_summary()


def test_profile_runs_mmengines_npu_profiler_hook(simulated_npu, tmp_path):
    """The hook runs, and the simulation warns that torch_npu 2.x has no ``npu.profile``."""
    from mmengine.hooks import NPUProfilerHook

    with pytest.warns(UserWarning, match="torch_npu.npu.profile is simulated: torch_npu 2.1"):
        hook = NPUProfilerHook(
            begin=0, end=1, result_path=str(tmp_path), exit_after_profiling=False
        )
    runner = SimpleNamespace(iter=0, max_iters=2, logger=logging.getLogger("npu_sim_profile"))
    hook.before_run(runner)
    hook.before_train_iter(runner, 0)
    (torch.ones(4, device="npu") * 2).sum()
    with pytest.raises(RuntimeError, match="not reentrant"):
        hook.profiler.__enter__()
    hook.after_train_iter(runner, 0)
    assert [p.name for p in tmp_path.iterdir()] == [hook.profiler.trace_path.split("/")[-1]]
    assert "aten::mul" in (tmp_path / hook.profiler.trace_path.split("/")[-1]).read_text()


def test_forked_worker_meeting_npu_tensors_is_refused_at_once():
    """A forked DataLoader worker that computes on npu tensors raises torch_npu's error (no
    hang); a forked worker that stays on the CPU still works beside the device."""
    code = """
        import os

        os.environ["NPUDET_SIMULATED_NPU"] = "1"  # set after the .pth line ran: see env below
        import torch
        from torch.utils.data import DataLoader, Dataset

        data = torch.arange(8.0, device="npu")

        class OnNpu(Dataset):
            def __len__(self):
                return 8

            def __getitem__(self, i):
                return data[i] * 2

        cpu = list(DataLoader(list(range(4)), num_workers=1, multiprocessing_context="fork"))
        print("cpu workers:", len(cpu), flush=True)
        list(DataLoader(OnNpu(), num_workers=1, multiprocessing_context="fork"))
    """
    # This checkout's stand-in, by PYTHONPATH: a .venv shared between checkouts has a .pth line
    # naming one of them.
    env = {k: v for k, v in npu_env().items() if k != ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SIM_PATH), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert "cpu workers: 4" in done.stdout, done.stderr[-3000:]
    assert done.returncode != 0
    assert "Cannot re-initialize NPU in forked subprocess" in done.stderr, done.stderr[-3000:]


def _lacking_rows() -> list:
    """The README's table of what torch_npu has and the simulation lacks, as (names, error)."""
    text = (REPO / "ops" / "npu_sim" / "README.md").read_text()
    section = text.split("### What torch_npu has and the simulation still lacks", 1)[1]
    rows = markdown_rows(section)
    return [
        (
            re.findall(r"`(torch(?:_npu|\.npu)\.[\w.]+)`", row["torch_npu API"]),
            row["what a user gets here"],
        )
        for row in rows
    ]


def _resolve(name: str, as_module: bool) -> None:
    """``import name`` or the attribute chain ``name`` from its top-level module."""
    if as_module:
        importlib.import_module(name)
        return
    first, *rest = name.split(".")
    target = importlib.import_module(first)
    for part in rest:
        target = getattr(target, part)


def test_what_the_readme_says_is_missing_is_missing(simulated_npu):
    """Every ``torch.npu.*`` / ``torch_npu.*`` name in the README's table of what the simulation
    lacks fails with the error its row names: the README matches the code."""
    rows = [(names, error) for names, error in _lacking_rows() if names]
    assert len(rows) >= 7, rows
    for names, error in rows:
        kind = re.match(r"`(\w+Error)", error).group(1)
        for name in names:
            with pytest.raises(getattr(builtins, kind)):
                _resolve(name, as_module=kind == "ModuleNotFoundError")


def test_rng_state_hook_restores_the_npu_generator(simulated_npu):
    """A resumed run on an accelerator draws the dropout masks the uninterrupted run drew."""
    from types import SimpleNamespace

    from npudet.hooks.rng_state_hook import RNGStateHook

    hook, checkpoint = RNGStateHook(), {}
    runner = SimpleNamespace(logger=logging.getLogger("rng"))
    torch.npu.manual_seed_all(3)
    hook.before_save_checkpoint(runner, checkpoint)
    expected = torch.rand(5, device="npu").cpu()
    torch.npu.manual_seed_all(0)  # what mmengine's re-seeding on resume does
    hook.after_load_checkpoint(runner, checkpoint)
    assert torch.equal(torch.rand(5, device="npu").cpu(), expected)
    assert len(checkpoint["meta"]["rng_state"]["devices"]["npu"]) == torch.npu.device_count()
