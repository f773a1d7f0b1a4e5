"""A stored record of one BEV training run, read from its mmengine work dir.

The README's and docs' BEV figures are read from this record rather than copied by hand:
the last validation's ``bev/*`` metrics (scalars.json), the per-class AP and true-positive
errors among them, the median iteration time and the training wall time (the text log's
timestamps), with the commit, CPU and command named.
"""

from __future__ import annotations

import glob
import json
import os
import re
import statistics
from datetime import datetime
from typing import Any, Dict, List, Optional, Sequence

from npudet.bev.evaluation.center_distance import TP_METRICS, TP_SUMMARY_KEYS

_STAMP = re.compile(r"^(\d{4}/\d\d/\d\d \d\d:\d\d:\d\d) - mmengine - ")
_SUMMARY = ("mAP", "NDS", *TP_SUMMARY_KEYS.values())


def _only(pattern: str) -> str:
    found = sorted(glob.glob(pattern))
    if not found:
        raise FileNotFoundError(f"no {pattern}: is it a tools/train.py work dir?")
    return found[-1]  # the latest run (timestamped folders sort by time)


def _stamps(log_file: str, marker: str = "") -> List[datetime]:
    """Timestamps of the log lines that contain ``marker``."""
    out = []
    with open(log_file) as f:
        for line in f:
            m = _STAMP.match(line)
            if m and marker in line:
                out.append(datetime.strptime(m.group(1), "%Y/%m/%d %H:%M:%S"))
    return out


def read_run(work_dir: str) -> Dict[str, Any]:
    """Metrics and timing of the latest run in ``work_dir``.

    Returns ``metrics`` (the last validation's ``bev/*`` values, prefix dropped), ``history``
    (every validation's step, i.e. epoch, and summary metrics), ``iters``
    (the last logged training iteration), ``sec_per_iter`` (median of the logged per-iteration
    times, each a mean over the logger's window), ``train_min`` (first log line to the last
    training log line: setup plus training, no validation) and ``total_min`` (to the last line).
    """
    scalars = _only(os.path.join(work_dir, "*", "vis_data", "scalars.json"))
    with open(scalars) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    vals = [r for r in rows if "bev/mAP" in r]
    if not vals:
        raise ValueError(f"{scalars}: no validation (bev/mAP) logged yet")
    metrics = {k[len("bev/") :]: float(v) for k, v in vals[-1].items() if k.startswith("bev/")}
    # every validation's summary (one per epoch with train_cfg.val_interval=1)
    history = [
        {"step": int(r["step"]), **{k: float(r[f"bev/{k}"]) for k in _SUMMARY}} for r in vals
    ]
    train = [r for r in rows if "loss" in r and "time" in r]
    log_file = _only(os.path.join(work_dir, "*", "*.log"))
    every, trained = _stamps(log_file), _stamps(log_file, "Epoch(train)")
    return dict(
        metrics=metrics,
        history=history,
        iters=int(train[-1]["iter"]) if train else 0,
        sec_per_iter=statistics.median(r["time"] for r in train) if train else float("nan"),
        train_min=(trained[-1] - every[0]).total_seconds() / 60.0 if trained else float("nan"),
        total_min=(every[-1] - every[0]).total_seconds() / 60.0,
    )


def markdown(record: Dict[str, Any]) -> str:
    """The record as a summary line, a per-class table and the provenance."""
    m = record["metrics"]
    classes = [k[len("AP/") :] for k in m if k.startswith("AP/") and "@" not in k]
    where = [f"commit {record['commit']}", record["cpu"]] + (
        [record["note"]] if record["note"] else []
    )
    lines = [
        f"# {record['name']}",
        "",
        "| " + " | ".join(_SUMMARY) + " | iterations | s / iter (median) | training (min) |",
        "|" + "---|" * (len(_SUMMARY) + 3),
        "| "
        + " | ".join(f"{m[k]:.4f}" for k in _SUMMARY)
        + f" | {record['iters']} | {record['sec_per_iter']:.3f} | {record['train_min']:.1f} |",
        "",
        "| class | AP | " + " | ".join(TP_SUMMARY_KEYS[k][1:] for k in TP_METRICS) + " |",
        "|" + "---|" * (len(TP_METRICS) + 2),
    ]
    for name in classes:
        cells = [f"{m[f'AP/{name}']:.4f}"] + [f"{m[f'{k}/{name}']:.4f}" for k in TP_METRICS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if len(record["history"]) > 1:
        lines += [
            "",
            "| epoch | " + " | ".join(_SUMMARY) + " |",
            "|" + "---|" * (len(_SUMMARY) + 1),
        ]
        for h in record["history"]:
            lines.append(f"| {h['step']} | " + " | ".join(f"{h[k]:.4f}" for k in _SUMMARY) + " |")
    lines += [
        "",
        "; ".join(where),
        "",
        "```bash",
        *record["commands"],
        "```",
        "",
    ]
    return "\n".join(lines)


def store_run(
    work_dir: str,
    out_dir: str,
    name: str,
    commit: str,
    cpu: str,
    commands: Sequence[str],
    note: Optional[str] = None,
) -> Dict[str, Any]:
    """Write ``metrics.json`` and ``summary.md`` for the latest run in ``work_dir``."""
    record = dict(name=name, commit=commit, cpu=cpu, commands=list(commands), note=note or "")
    record.update(read_run(work_dir))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "metrics.json"), "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(markdown(record))
    return record
