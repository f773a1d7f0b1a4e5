"""tools/analysis_tools/ablate.py: two implementations x 3 iterations of the small Deformable DETR,
all outputs written; the small BEV config too (both slow); in the default run the order the
variants run in (interleaved round by round), the marking of loaded runs on an injected load,
the refusal of a variant that cannot run before any training, and the table arithmetic on
hand-made records."""

from __future__ import annotations

import argparse
import csv
import json

import pytest
from matplotlib.colors import to_hex
from plugin_util import ROOT, SMALL_DETR, run_tool

from npudet.ablation import ablate as ablate_module
from npudet.ablation.report import markdown_table, summarise, time_split_figure
from npudet.ablation.variants import Variant, parse_variants
from npudet.benchmark import conditions

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def ablate_tool(config: str, impls: str, iters: int, work, data_option: str, *args: str):
    """``tools/analysis_tools/ablate.py`` on ``config`` for ``iters`` iterations (1 warm-up) into
    ``work``."""
    return run_tool(
        [
            "tools/analysis_tools/ablate.py",
            config,
            "--impls",
            impls,
            "--iters",
            str(iters),
            "--warmup",
            "1",
            *args,
            "--work-dir",
            str(work),
            "--cfg-options",
            data_option,
        ]
    )


# 44 s and 36 s on 2 cores: the default run keeps the run order, the loaded marking and the
# refusal below on stand-in runs; these train for real.
@pytest.mark.slow
def test_ablate_two_impls_three_iters(tiny_shapes, tmp_path):
    work = tmp_path / "ablate"
    proc = ablate_tool(
        SMALL_DETR, "grid_sample,cpu", 3, work, f"train_dataloader.dataset.data_root={tiny_shapes}/"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("ablation.md", "ablation.csv", "loss_curves.png", "iter_time_split.png"):
        assert (work / name).is_file(), name
    for name in ("loss_curves.png", "iter_time_split.png"):
        assert (work / name).read_bytes()[:8] == PNG_MAGIC

    with open(work / "ablation.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["variant"] for r in rows] == ["grid_sample", "cpu"]
    assert float(rows[0]["speedup"]) == 1.0 and float(rows[0]["max_loss_dev"]) == 0.0
    for row in rows:
        assert float(row["iter_ms"]) > 0 and float(row["peak_mem_mb"]) > 0
        assert float(row["msda_fwd_ms"]) > 0 and float(row["msda_bwd_ms"]) > 0
        assert 0 < float(row["msda_share"]) < 100
    # Same seed, same initial weights, same data: the curves differ by fp32 round-off only.
    assert float(rows[1]["max_rel_loss_dev"]) < 1e-4

    records = {}
    for impl in ("grid_sample", "cpu"):
        with open(work / impl / "round0" / "record.json") as f:
            records[impl] = json.load(f)
        assert records[impl]["msda_impls"] == {"encoder": impl, "decoder": impl}
        assert len(records[impl]["loss"]) == len(records[impl]["iter_ms"]) == 3
        assert records[impl]["msda_calls"] == 6  # 3 encoder + 3 decoder layers
    first = [records[impl]["loss"][0] for impl in records]
    assert first[0] == pytest.approx(first[1], rel=1e-5)
    assert "| grid_sample |" in proc.stdout and "| cpu |" in proc.stdout
    stored = json.loads((work / "ablation.json").read_text())
    assert stored["machine"]["cpu_model"] and stored["commit"]
    for impl in ("grid_sample", "cpu"):
        (run,) = stored["runs"]["eager"][impl]
        assert len(run["iter_cpu_ms"]) == 3 and min(run["iter_cpu_ms"]) > 0
        cond = run["conditions"]
        assert len(cond["load_1m"]) == 2 and cond["cpu_s"] > 0 and cond["wall_s"] > 0
        assert cond["threads"] == 2
    assert all(row["loaded"] in ("True", "False") for row in rows)


@pytest.mark.slow
def test_ablate_bev_config(tmp_path):
    from bev_util import tiny_bev_set

    data_root = f"{tmp_path}/bev/"
    tiny_bev_set(data_root)
    work = tmp_path / "ablate"
    proc = ablate_tool(
        f"{ROOT}/configs/bev/bev-small_r18_synthetic.py",
        "grid_sample,cpu",
        2,
        work,
        f"train_dataloader.dataset.data_root={data_root}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(work / "ablation.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["variant"] for r in rows] == ["grid_sample", "cpu"]
    for row in rows:
        assert float(row["iter_ms"]) > 0 and 0 < float(row["msda_share"]) < 100
    losses = []
    for impl in ("grid_sample", "cpu"):
        with open(work / impl / "round0" / "record.json") as f:
            record = json.load(f)
        assert record["msda_impls"] == {"encoder": impl, "decoder": impl}
        assert record["msda_calls"] > 0
        losses.append(record["loss"][0])
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


def test_ablate_bad_impls_one_line(tmp_path):
    proc = run_tool(
        [
            "tools/analysis_tools/ablate.py",
            SMALL_DETR,
            "--impls",
            "cpu,nope",
            "--work-dir",
            str(tmp_path / "w"),
        ]
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: --impls item 'nope'")
    assert not (tmp_path / "w").exists()


def test_ablate_refuses_a_variant_that_cannot_run_before_any_training(tmp_path):
    """``triton`` on CPU tensors without the interpreter: refused in one line naming the
    variant, before the baseline trains (the work dir is never made)."""
    work = tmp_path / "w"
    proc = run_tool(
        [
            "tools/analysis_tools/ablate.py",
            SMALL_DETR,
            "--impls",
            "grid_sample,triton",
            "--work-dir",
            str(work),
        ],
        env={"TRITON_INTERPRET": "0"},
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --impls variant 'triton' cannot run:"), last
    assert "Triton interpreter" in last and not work.exists()
    assert "[ablate]" not in proc.stdout


def _fake_record(iter_ms, iter_cpu_ms):
    return dict(
        loss=[3.0, 2.0, 1.0], iter_ms=iter_ms, iter_cpu_ms=iter_cpu_ms, msda_fwd_ms=[5.0] * 3,
        msda_bwd_ms=[5.0] * 3, msda_calls=6, peak_mem_mb=100.0, device="cpu", threads=2,
        torch="x", graph_breaks=0, msda_impls=None,
    )  # fmt: skip


def test_ablate_interleaves_rounds_and_marks_a_loaded_run(tmp_path, monkeypatch):
    """Two rounds run grid_sample, cpu, grid_sample, cpu; cpu's second round sees a load of
    3.6 on 2 threads: its speed-up is marked loaded (table, CSV, JSON, plot) with the CPU-time
    speed-up beside it; the baseline's is not."""
    order, loads = [], iter([0.2, 0.3, 0.2, 0.3, 0.2, 0.3, 3.4, 3.6])
    monkeypatch.setattr(conditions, "load_1m", lambda: next(loads))

    def fake_run(spec, threads):
        order.append((spec["msda"]["impl"], spec["work_dir"].rsplit("round", 1)[1]))
        fast = spec["msda"]["impl"] == "cpu"
        return (
            _fake_record([999.0, 50.0, 50.0], [999.0, 60.0, 60.0])
            if fast
            else _fake_record([999.0, 100.0, 100.0], [999.0, 150.0, 150.0])
        )

    monkeypatch.setattr(ablate_module, "run_variant", fake_run)
    monkeypatch.setattr(ablate_module, "save_initial_weights", lambda *args: None)
    monkeypatch.setattr(ablate_module, "check_data", lambda *args: None)
    work = tmp_path / "ablate"
    args = argparse.Namespace(
        config=SMALL_DETR, impls="grid_sample,cpu", iters=3, work_dir=str(work), threads=2,
        rounds=2, warmup=1, seed=0, compile=None, cfg_options=None,
    )  # fmt: skip
    ablate_module.ablate(args)
    assert order == [("grid_sample", "0"), ("cpu", "0"), ("grid_sample", "1"), ("cpu", "1")]
    stored = json.loads((work / "ablation.json").read_text())
    base, cpu = stored["rows"]
    assert not base["loaded"] and cpu["loaded"]
    assert cpu["loaded_why"] == "cpu: load 3.6 > 2 threads + 0.5"
    assert cpu["speedup"] == pytest.approx(2.0) and cpu["cpu_time_speedup"] == pytest.approx(2.5)
    assert stored["runs"]["eager"]["cpu"][1]["conditions"]["load_1m"] == [3.4, 3.6]
    md = (work / "ablation.md").read_text()
    assert "| (2.00x) loaded, CPU-time 2.50x |" in md and "| 1.00x |" in md
    assert "loaded (cpu: load 3.6 > 2 threads + 0.5)" in md
    with open(work / "ablation.csv") as f:
        assert [r["loaded"] for r in csv.DictReader(f)] == ["False", "True"]


def test_time_split_plot_greys_a_loaded_variant():
    runs = {
        "grid_sample": [_fake_record([9.0, 100.0, 100.0], [9.0, 150.0, 150.0])],
        # wall 2x its CPU time (no load recorded): the starved rule marks it
        "cpu": [_fake_record([9.0, 50.0, 50.0], [9.0, 25.0, 25.0])],
    }
    parts = {k: {"encoder": k, "decoder": k} for k in runs}
    rows = summarise(runs, parts, warmup=1)
    assert [r.loaded for r in rows] == [False, True]
    assert rows[1].loaded_why == "cpu: wall 2.0x CPU time"
    fig = time_split_figure(rows, "t")
    (ax,) = fig.axes
    colours = [to_hex(bar.get_facecolor()) for bar in ax.patches]
    # three stacked parts per variant, in variant order within each part
    assert colours[1::2] == [conditions.LOADED_STYLE["facecolor"]] * 3
    assert "#bdbdbd" not in colours[0::2]
    texts = {t.get_text(): to_hex(t.get_color()) for t in ax.texts}
    assert texts["100 ms\n1.00x"] == "#000000"
    assert texts["50 ms\n(wall 2.00x: loaded)\nCPU-time 6.00x"] == conditions.LOADED_TEXT


def test_parse_variants_per_layer():
    variants = parse_variants("grid_sample,cpu/grid_sample")
    assert variants == [Variant("grid_sample", "grid_sample"), Variant("cpu", "grid_sample")]
    assert variants[1].label == "cpu/grid_sample" and variants[1].dirname == "cpu__grid_sample"
    assert variants[1].msda_cfg() == dict(impl="cpu", encoder="cpu", decoder="grid_sample")
    assert variants[0].msda_cfg() == dict(impl=variants[0].encoder)  # any model, one part or two
    for bad in ("cpu,cpu", "cpu/", "a/b/c", ""):
        with pytest.raises(ValueError, match="--impls"):
            parse_variants(bad)


def test_parse_variants_with_layer_pieces():
    variants = parse_variants("cpu:stock,cpu:ffn+dropout,cpu/grid_sample:projections,cpu")
    assert [v.label for v in variants] == [
        "cpu:stock", "cpu:ffn+dropout", "cpu/grid_sample:projections", "cpu",
    ]  # fmt: skip
    assert variants[1].dirname == "cpu-ffn+dropout"
    assert variants[1].msda_cfg() == dict(impl="cpu", layers="ffn+dropout")
    assert variants[2].msda_cfg()["layers"] == "projections"
    assert "layers" not in variants[3].msda_cfg()  # the config's own
    with pytest.raises(ValueError, match=r"--impls item 'cpu:gelu': expected 'fast'"):
        parse_variants("cpu:gelu")
    with pytest.raises(ValueError, match="--impls"):
        parse_variants("cpu:")


def _record(loss, iter_ms, fwd, bwd):
    return dict(loss=loss, iter_ms=iter_ms, msda_fwd_ms=fwd, msda_bwd_ms=bwd, peak_mem_mb=100.0)


def test_summarise_medians_speedup_and_deviation():
    runs = {
        "grid_sample": [_record([3.0, 2.0, 1.0], [999, 200, 220], [50, 60, 70], [50, 40, 40])],
        "cpu": [_record([3.0, 2.5, 1.0], [999, 100, 120], [5, 5, 5], [5, 5, 5])],
    }
    parts = {k: {"encoder": k, "decoder": k} for k in runs}
    base, cpu = summarise(runs, parts, warmup=1)
    assert base.iter_ms == 210 and cpu.iter_ms == 110  # medians without the warm-up iter
    assert cpu.speedup == pytest.approx(210 / 110)
    assert base.msda_fwd_ms == 65 and base.msda_bwd_ms == 40
    # Shares per iteration: 100/200 = 50 %, 110/220 = 50 %.
    assert base.msda_share == pytest.approx(50.0)
    assert cpu.max_loss_dev == pytest.approx(0.5) and cpu.max_rel_loss_dev == pytest.approx(0.25)
    assert cpu.final_loss == 1.0
    table = markdown_table([base, cpu])
    assert table.count("\n") == 4 and "| cpu | cpu | cpu | 110.0 | 1.91x |" in table


def test_summarise_compiled_columns():
    runs = {"cpu": [_record([3.0, 2.0, 1.0], [999, 100, 120], [5, 5, 5], [5, 5, 5])]}
    compiled = {"cpu": [dict(_record([3.0, 2.0, 1.1], [9999, 50, 60], [0] * 3, [0] * 3))]}
    compiled["cpu"][0]["graph_breaks"] = 7
    parts = {"cpu": {"encoder": "cpu", "decoder": "cpu"}}
    (row,) = summarise(runs, parts, warmup=1, compiled=compiled)
    assert row.compiled_iter_ms == 55 and row.compiled_speedup == pytest.approx(110 / 55)
    assert row.compiled_rel_dev == pytest.approx(0.1) and row.graph_breaks == 7
    table = markdown_table([row])
    assert "compiled vs eager" in table and "| 55.0 | 2.00x | 1.00e-01 | 7 |" in table
    (plain,) = summarise(runs, parts, warmup=1)
    assert "compiled" not in markdown_table([plain])


# Two minutes on 2 cores; the default run keeps the compiled training of
# tests/hooks/test_compile_train.py and the column's arithmetic (test_summarise_compiled_columns).
@pytest.mark.slow
def test_ablate_compiled_column(tiny_shapes, tmp_path):
    """``--compile``: each variant also runs with its forward compiled (aot_eager here:
    the inductor path is tests/hooks/test_compile_train.py's), same losses, breaks counted."""
    work = tmp_path / "ablate"
    proc = ablate_tool(
        SMALL_DETR,
        "cpu",
        3,
        work,
        f"train_dataloader.dataset.data_root={tiny_shapes}/",
        "--compile",
        "aot_eager",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(work / "ablation.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert float(row["compiled_iter_ms"]) > 0 and float(row["compiled_speedup"]) > 0
    assert float(row["compiled_rel_dev"]) < 1e-4 and int(row["graph_breaks"]) > 0
    with open(work / "cpu_compiled" / "round0" / "record.json") as f:
        record = json.load(f)
    assert len(record["loss"]) == 3 and record["graph_breaks"] > 0
    assert "compiled: torch.compile backend aot_eager" in proc.stdout
