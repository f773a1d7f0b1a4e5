"""Train one config with several MSDA implementations side by side and compare them
(``tools/analysis_tools/ablate.py``'s command; its docstring lists the options).

Every variant trains from the same seed and the same initial weights (built once, saved as
``init_weights.pth``) for N iterations, each in its own process (:mod:`.worker`); with
``compile`` every variant also trains with its forward under ``torch.compile`` right after
its eager run. Variants are interleaved round by round (with ``rounds`` > 1: A B A B, not
A A B B) and every run records its conditions (load average before and after, CPU and wall
time of its process, threads; npudet.benchmark.conditions), so a speed-up taken while the
machine was loaded is marked ``loaded``. The work dir gets ``ablation.md``, ``ablation.csv``,
``ablation.json`` (every run's record, the machine, the commit: what the table and plots are
drawn from), ``loss_curves.png``, ``iter_time_split.png`` (:mod:`.report`) and one folder per
run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict
from typing import Dict, List

import torch
from mmengine.config import Config
from mmengine.runner import set_random_seed
from mmengine.utils import import_modules_from_strings

from npudet.benchmark.conditions import RULE, Recorder
from npudet.benchmark.provenance import provenance
from npudet.engine.cli import fail, run_checks
from npudet.engine.preflight import PreflightError, check_data, check_msda
from npudet.utils import current_device_type
from npudet.utils.device import SIMULATED_NPU_NOTE, simulated_npu

from .report import markdown_table, plot_loss_curves, plot_time_split, summarise, write_csv
from .variants import Variant, default_impls, parse_variants


def save_initial_weights(cfg: Config, seed: int, path: str) -> None:
    """Build the model once from ``seed`` and save its initialised state dict."""
    from mmdet.registry import MODELS
    from mmengine.logging import MMLogger
    from mmengine.registry import init_default_scope

    # init_weights reports every parameter to the current logger; keep the console quiet.
    MMLogger.get_instance("npudet-ablate", log_level="WARNING")

    if cfg.get("custom_imports"):
        import_modules_from_strings(**cfg.custom_imports)
    init_default_scope(cfg.get("default_scope", "mmdet"))
    set_random_seed(seed)
    model = MODELS.build(cfg.model)
    model.init_weights()
    torch.save({"state_dict": model.state_dict(), "meta": {"seed": seed}}, path)


def check_variants(variants: List[Variant], device: str) -> None:
    """Every variant's implementations can run on ``device`` (checked before any training: a
    variant that cannot run would otherwise fail after the ones before it trained);
    ``PreflightError`` naming the first variant that cannot, and why."""
    for variant in variants:
        try:
            check_msda(Config(dict(model=dict(msda=variant.msda_cfg()))), device)
        except PreflightError as err:
            raise PreflightError(f"--impls variant {variant.label!r} cannot run: {err}") from None


def run_variant(spec: Dict, threads: int, module: str = "npudet.ablation.worker") -> Dict:
    """Train one variant in a child process (``python -m module SPEC``); returns its record."""
    os.makedirs(spec["work_dir"], exist_ok=True)
    spec_path = os.path.join(spec["work_dir"], "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f, indent=1)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    log_path = os.path.join(spec["work_dir"], "worker.log")
    with open(log_path, "w") as log:
        proc = subprocess.run(
            [sys.executable, "-m", module, spec_path],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    if proc.returncode != 0:
        with open(log_path) as f:
            tail = f.read().splitlines()[-15:]
        fail(f"run {spec['work_dir']} failed (exit {proc.returncode}):\n" + "\n".join(tail))
    with open(os.path.join(spec["work_dir"], "record.json")) as f:
        return json.load(f)


def ablate(args: argparse.Namespace) -> None:
    """Run the ablation that ``tools/analysis_tools/ablate.py``'s arguments describe."""
    if not os.path.isfile(args.config):
        fail(f"config file not found: {args.config}")
    try:
        variants: List[Variant] = parse_variants(args.impls or default_impls(current_device_type()))
    except ValueError as err:
        fail(str(err))
    run_checks(lambda: check_variants(variants, current_device_type()))
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    run_checks(lambda: check_data(cfg, ["train"]))
    name = os.path.splitext(os.path.basename(args.config))[0]
    work_dir = args.work_dir or os.path.join("work_dirs", "ablate", name)
    os.makedirs(work_dir, exist_ok=True)
    init_path = os.path.abspath(os.path.join(work_dir, "init_weights.pth"))
    save_initial_weights(cfg, args.seed, init_path)

    modes = {"eager": None}
    if args.compile:
        modes["compiled"] = dict(backend=args.compile)
    runs: Dict[str, Dict[str, List[Dict]]] = {m: {v.label: [] for v in variants} for m in modes}
    for round_idx in range(args.rounds):
        for variant in variants:
            for mode, compile_options in modes.items():
                suffix = "" if compile_options is None else "_compiled"
                run_dir = os.path.join(work_dir, variant.dirname + suffix, f"round{round_idx}")
                print(
                    f"[ablate] {variant.label}{suffix} (round {round_idx + 1}/{args.rounds})",
                    flush=True,
                )
                spec = dict(
                    config=os.path.abspath(args.config),
                    cfg_options=args.cfg_options,
                    msda=variant.msda_cfg(),
                    iters=args.iters,
                    work_dir=os.path.abspath(run_dir),
                    load_from=init_path,
                    seed=args.seed,
                    threads=args.threads,
                    compile=compile_options,
                )
                cpu_bound = current_device_type() == "cpu"
                with Recorder(args.threads, children=True, cpu_bound=cpu_bound) as conditions:
                    record = run_variant(spec, args.threads)
                runs[mode][variant.label].append({**record, "conditions": conditions.record})

    parts = {v.label: {"encoder": v.encoder, "decoder": v.decoder} for v in variants}
    warmup = min(args.warmup, args.iters - 1)
    rows = summarise(runs["eager"], parts, warmup, runs.get("compiled"))
    first = runs["eager"][variants[0].label][0]
    source = provenance()
    machine = source["machine"]
    header = (
        f"{name}: {args.iters} iterations x {args.rounds} round(s), variants interleaved round "
        f"by round, {args.threads} threads, device {first['device']}, torch {first['torch']}; "
        f"CPU {machine['cpu_model']}, ATen capability {machine['aten_capability']}; commit "
        f"{source['commit'][:10]}; times are medians after "
        f"{warmup} warm-up iterations; speed-up and loss deviation vs {variants[0].label}; "
        f"{RULE} (shown with its CPU-time speed-up)"
        + (f"; compiled: torch.compile backend {args.compile}" if args.compile else "")
        + (f"; {SIMULATED_NPU_NOTE}" if first["device"] == "npu" and simulated_npu() else "")
        + "\n\n"
    )
    table = markdown_table(rows)
    stored = dict(
        source, config=args.config, iters=args.iters, rounds=args.rounds, warmup=warmup,
        threads=args.threads, variants=[v.label for v in variants], parts=parts, runs=runs,
        rows=[asdict(r) for r in rows], loaded_rule=RULE,
    )  # fmt: skip
    with open(os.path.join(work_dir, "ablation.json"), "w") as f:
        json.dump(stored, f, indent=1)
    with open(os.path.join(work_dir, "ablation.md"), "w") as f:
        f.write(header + table)
    write_csv(rows, os.path.join(work_dir, "ablation.csv"))
    plot_loss_curves(
        runs["eager"], os.path.join(work_dir, "loss_curves.png"), f"{name}: training loss"
    )
    plot_time_split(rows, os.path.join(work_dir, "iter_time_split.png"), f"{name}: time per iter")
    print(header + table, end="")
    print(
        "[ablate] wrote ablation.md, ablation.csv, ablation.json, loss_curves.png, "
        f"iter_time_split.png to {work_dir}"
    )
