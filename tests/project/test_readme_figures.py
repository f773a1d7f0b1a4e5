"""Every number in README.md's headline table has its stored file, or says it has none.

A row whose figure cell holds a number must link a file or folder under ``results/`` that
exists (the measurement's own output, with its commit and machine), or carry the words
"not stored". The check itself is tested on rows made to fail.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Dict, List

import pytest
from table_util import markdown_rows

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def headline_rows(readme: str) -> List[Dict[str, str]]:
    """The body rows of the table under ``## Headline figures``, by column name."""
    return markdown_rows(readme.split("## Headline figures", 1)[1].split("\n## ", 1)[0])


def unbacked(rows: List[Dict[str, str]], root: Path = ROOT) -> List[str]:
    """Rows with a number in their ``figure`` cell but neither a link to an existing path
    under results/ nor a "not stored" mark."""
    bad = []
    for cells in rows:
        if not re.search(r"\d", cells["figure"]):
            continue
        row = " | ".join(cells.values())
        targets = [t.split("#", 1)[0] for t in LINK.findall(row)]
        stored = [t for t in targets if t.startswith("results/") and (root / t).exists()]
        if not stored and "not stored" not in row:
            bad.append(row[:120])
    return bad


def test_every_headline_figure_has_its_file_or_says_not_stored():
    rows = headline_rows((ROOT / "README.md").read_text())
    assert len(rows) >= 5
    assert unbacked(rows) == []


@pytest.mark.parametrize(
    ("figure", "command", "fails"),
    [
        ("AP 0.6", "[docs](docs/index.md)", True),  # a page is not the stored output
        ("AP 0.6", "[file](results/no_such_file.json)", True),
        ("AP 0.6", "[file](results/kernel_compile.json)", False),
        ("AP 0.6 (not stored)", "cmd", False),
        ("faster", "cmd", False),  # no number, nothing to back
    ],
)
def test_the_check_fails_a_row_without_its_file(figure, command, fails):
    assert bool(unbacked([dict(what="x", figure=figure, command=command)])) is fails


@pytest.mark.dev  # dev/tools/host_cost_at.py
def test_the_host_cost_table_in_the_docs_is_the_stored_file():
    """docs/ops/index.md quotes ``dev/tools/host_cost_at.py --table-of`` of the stored report,
    whose two commits are named and whose "before" precedes the call plans."""
    spec = importlib.util.spec_from_file_location(
        "host_cost_at", ROOT / "dev/tools/host_cost_at.py"
    )
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    report = json.loads((ROOT / "results" / "host_cost_before_after.json").read_text())
    assert set(report["checkouts"]) == {"before", "after"}
    assert report["machine"]["cpu_model"] and report["machine"]["aten_capability"]
    assert all(len(c["commit"]) >= 40 for c in report["checkouts"].values())
    assert tool.table(report) in (ROOT / "docs" / "ops" / "index.md").read_text()
