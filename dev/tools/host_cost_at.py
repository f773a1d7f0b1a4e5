"""Host cost per call of the public MSDA op at several commits, side by side.

    python dev/tools/host_cost_at.py --checkout before=../old-checkout --checkout after=. \
        --runs 3 --json results/host_cost_before_after.json

Each checkout is a git work tree of npudet at some commit (``git worktree add DIR COMMIT``);
for each, a child process imports ``npudet`` from it (``PYTHONPATH``) and times what every
version of the op has had: ``npudet.ops.multi_scale_deformable_attn(..., impl=...)`` on one
query of a 2x2 map (batch 1, 1 head, head_dim 8, 1 level, 1 point: the kernels do next to
nothing), forward + ``.sum().backward()`` and forward under ``torch.no_grad()``, beside one
ATen op with autograd (``F.grid_sample``, two inputs with gradients) timed in the same
rounds as the yardstick. One intra-op thread; functions interleaved round by round, each
cell the median of the rounds. Children of the checkouts alternate (run 1 of each, then
run 2, ...) so load on a shared machine meets them alike; the table gives the median over
runs and the ratio to the yardstick. Each child's conditions are recorded (load average before
and after, CPU and wall time; npudet.benchmark.conditions) and a checkout with a loaded
child is named under the table. ``tools/analysis_tools/benchmark_msda.py --host`` measures more (the
kernel ops alone, forward with grad) but only at commits that have it; this measures the
same quantity at any commit with the public op.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence

IMPLS = ("auto", "cpu", "gather", "grid_sample")
YARDSTICK = "aten grid_sample"
TIMES = ("fwd_bwd_us", "nograd_fwd_us")


def _calls() -> Dict[str, Dict[str, Callable[[], object]]]:
    """name -> {time -> call} for the op's implementations and the yardstick (child side)."""
    import torch
    import torch.nn.functional as F

    from npudet.ops import msda_impls, multi_scale_deformable_attn

    gen = torch.Generator().manual_seed(0)
    value = torch.randn(1, 4, 1, 8, generator=gen).requires_grad_()
    loc = torch.rand(1, 1, 1, 1, 1, 2, generator=gen).requires_grad_()
    attn = torch.rand(1, 1, 1, 1, 1, generator=gen).requires_grad_()
    shapes, starts = torch.tensor([[2, 2]]), torch.tensor([0])
    image = torch.randn(1, 8, 2, 2, generator=gen).requires_grad_()
    grid = torch.rand(1, 1, 1, 2, generator=gen).requires_grad_()

    def pair(fwd: Callable[[], torch.Tensor]) -> Dict[str, Callable[[], object]]:
        return {"fwd_bwd_us": lambda: fwd().sum().backward(), "nograd_fwd_us": fwd}

    calls = {YARDSTICK: pair(lambda: F.grid_sample(image, grid, align_corners=False))}
    usable = set(msda_impls()) | {"auto"}
    inputs = (value, shapes, starts, loc, attn)
    for impl in IMPLS:
        if impl in usable:
            calls[impl] = pair(lambda impl=impl: multi_scale_deformable_attn(*inputs, impl=impl))
    return calls


def _child(rounds: int, calls_per_round: int) -> dict:
    """Time every call (us per call), ``rounds`` interleaved rounds; the medians."""
    import torch

    torch.set_num_threads(1)
    calls = _calls()
    samples: Dict[str, Dict[str, List[float]]] = {n: {t: [] for t in TIMES} for n in calls}
    for timed in calls.values():  # warm-up: builds, verification, plans
        for when, call in timed.items():
            with torch.no_grad() if when == "nograd_fwd_us" else torch.enable_grad():
                for _ in range(20):
                    call()
    for _ in range(rounds):
        for name, timed in calls.items():
            for when, call in timed.items():
                with torch.no_grad() if when == "nograd_fwd_us" else torch.enable_grad():
                    start = time.perf_counter()
                    for _ in range(calls_per_round):
                        call()
                    samples[name][when].append(
                        (time.perf_counter() - start) / calls_per_round * 1e6
                    )
    import npudet

    return {
        "npudet": str(Path(npudet.__file__).resolve().parent),
        "torch": torch.__version__,
        "us": {n: {t: statistics.median(v) for t, v in s.items()} for n, s in samples.items()},
    }


def _commit(root: Path) -> str:
    head = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return head + ("+dirty" if dirty else "")


def machine() -> dict:
    """CPU model, its vector flags of interest and ATen's capability."""
    import torch

    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                if key.strip() == "model name" and model in ("", platform.machine()):
                    model = val.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(val.split())
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile")
    return {
        "cpu_model": model,
        "cpu_features": [f for f in wanted if f in flags],
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(),
    }


def table(report: dict) -> str:
    """Markdown: per call, each checkout's median us (ratio to the yardstick); the checkouts
    with a loaded child below it."""
    from npudet.benchmark.conditions import RULE, record_reasons

    labels = list(report["checkouts"])
    head = ["call (us)"] + [f"{t[:-3].replace('_', ' ')} {lab}" for t in TIMES for lab in labels]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    names = [*IMPLS, YARDSTICK]
    for name in names:
        cells = [f"`{name}`" if name != YARDSTICK else "ATen `F.grid_sample` (yardstick)"]
        for when in TIMES:
            for lab in labels:
                cell = report["checkouts"][lab]["median_us"].get(name, {}).get(when)
                floor = report["checkouts"][lab]["median_us"][YARDSTICK][when]
                if cell is None:
                    cells.append("-")
                elif name == YARDSTICK:
                    cells.append(f"{cell:.1f}")
                else:
                    cells.append(f"{cell:.1f} ({cell / floor:.2f}x)")
        lines.append("| " + " | ".join(cells) + " |")
    commits = ", ".join(f"{lab} {c['commit'][:7]}" for lab, c in report["checkouts"].items())
    loaded = [
        f"{lab}: {'; '.join(why)}"
        for lab, c in report["checkouts"].items()
        for why in [[w for cond in c.get("runs_conditions", []) for w in record_reasons(cond)]]
        if why
    ]
    notes = f"\n\nLoaded children ({RULE}): " + "; ".join(loaded) if loaded else ""
    return (
        f"Host cost per call ({commits}; {report['machine']['cpu_model']}):\n\n"
        + "\n".join(lines)
        + notes
    )


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", action="append", default=[], help="LABEL=DIR (repeat)")
    parser.add_argument("--runs", type=int, default=3, help="child processes per checkout")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per child")
    parser.add_argument("--calls", type=int, default=1000, help="calls per round")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    parser.add_argument("--table-of", type=Path, default=None, help="print a stored report")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(list(argv) or None)
    if args.child:
        print(json.dumps(_child(args.rounds, args.calls)))
        return 0
    if args.table_of is not None:
        print(table(json.loads(args.table_of.read_text())))
        return 0
    if not args.checkout:
        parser.error("--checkout LABEL=DIR: at least one")
    roots = {}
    for item in args.checkout:
        label, _, path = item.partition("=")
        roots[label] = Path(path).resolve()
    # Here, not at the top: the children import npudet from their checkouts, older ones too.
    from npudet.benchmark.conditions import Recorder

    runs: Dict[str, List[dict]] = {label: [] for label in roots}
    for _ in range(args.runs):
        for label, root in roots.items():
            env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child"]
            cmd += ["--rounds", str(args.rounds), "--calls", str(args.calls)]
            with Recorder(1, children=True) as conditions:
                proc = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True)
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
                return 1
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            if Path(result["npudet"]) != root / "npudet":
                print(f"{label}: imported {result['npudet']}, not {root}", file=sys.stderr)
                return 1
            runs[label].append({**result, "conditions": conditions.record})
    # The checkouts by commit, not by where they lie on this machine.
    commits = {label: _commit(root) for label, root in roots.items()}
    shown = [f"--checkout {label}=CHECKOUT_OF_{commits[label][:7]}" for label in roots]
    shown += [f"--runs {args.runs}", f"--rounds {args.rounds}", f"--calls {args.calls}"]
    shown += [f"--json {args.json}"] if args.json else []
    report = {
        "command": "python dev/tools/host_cost_at.py " + " ".join(shown),
        "machine": machine(),
        "threads": 1,
        "runs": args.runs,
        "rounds": args.rounds,
        "calls_per_round": args.calls,
        "checkouts": {
            label: {
                "commit": commits[label],
                "torch": runs[label][0]["torch"],
                "median_us": {
                    name: {
                        t: statistics.median(r["us"][name][t] for r in runs[label]) for t in TIMES
                    }
                    for name in runs[label][0]["us"]
                },
                "runs_us": [r["us"] for r in runs[label]],
                "runs_conditions": [r["conditions"] for r in runs[label]],
            }
            for label, root in roots.items()
        },
    }
    print(table(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
